"""Checkpoints of a ZeRO engine: sharded, atomic, readable at any data-parallel size and stage.

``sharded`` saves and loads through the engine (``engine.save_checkpoint`` / ``load_checkpoint``);
``format`` is the file format and its reader, which needs no engine (``python -m zero_ref.ds.utils.zero_to_fp32``
consolidates a checkpoint with it). This face only re-exports.
"""
from zero_ref.checkpoint.format import CheckpointError, Reader, checkpoint_bytes, deepspeed_file_names, resolve
from zero_ref.checkpoint.sharded import load, save

__all__ = ["save", "load", "CheckpointError", "Reader", "resolve", "checkpoint_bytes", "deepspeed_file_names"]
