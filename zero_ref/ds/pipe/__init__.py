"""DeepSpeed's pipeline API (``deepspeed.pipe``): ``PipelineModule``, ``LayerSpec``, ``TiedLayerSpec``;
``zero_ref.initialize(model=PipelineModule(...))`` returns a ``PipelineEngine`` (``train_batch`` /
``eval_batch``), which runs DeepSpeed's 1F1B order (``zero_ref.parallel.schedules``) on real ranks."""
from zero_ref.ds.pipe.engine import PipelineEngine
from zero_ref.ds.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "PipelineEngine"]
