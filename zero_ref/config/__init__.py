"""The DeepSpeed JSON config, read and checked (pure Python: no torch, so the simulator reads it too).

    cfg = zero_ref.config.parse("ds_config.json", dp=4)    # a path, a JSON string in base64, or a dict
    cfg.zero_optimization.stage, cfg.batch.train_micro_batch_size_per_gpu, cfg.precision
    zero_ref.config.problems(config, dp=4)                  # every problem at once, not only the first

schema.py declares the keys (types, DeepSpeed 0.19.8's defaults, ranges), rules.py the checks that
involve several keys, batch.py DeepSpeed's batch-size arithmetic, and reader.py reads a config against
them. This face only re-exports.
"""
from zero_ref.config.reader import (Config, ConfigError, ConfigWarning, defaults_table, format_defaults, load, model_state_placement,
                                    offload_sections, parse, problems, resolve_batch)
from zero_ref.config.schema import OffloadOptimizerConfig, OffloadParamConfig

__all__ = ["ConfigError", "ConfigWarning", "Config", "parse", "problems", "load", "resolve_batch", "offload_sections",
           "defaults_table", "format_defaults", "model_state_placement",
           "OffloadOptimizerConfig", "OffloadParamConfig"]
