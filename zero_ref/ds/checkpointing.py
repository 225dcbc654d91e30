"""``deepspeed.checkpointing``: zero_ref's activation checkpointing under DeepSpeed's name."""
from zero_ref.activation_checkpointing import (CheckpointFunction, RNGStatesTracker, Stats, checkpoint,
                                               checkpoint_layers, configure, configure_from_config,
                                               get_cuda_rng_tracker, get_rng_tracker, is_configured,
                                               model_parallel_cuda_manual_seed, model_parallel_manual_seed, reset,
                                               settings, stats)

__all__ = ["CheckpointFunction", "configure", "configure_from_config", "checkpoint", "checkpoint_layers",
           "is_configured", "reset", "settings", "stats", "Stats", "RNGStatesTracker", "get_rng_tracker",
           "get_cuda_rng_tracker", "model_parallel_manual_seed", "model_parallel_cuda_manual_seed"]
