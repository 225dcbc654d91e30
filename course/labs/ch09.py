"""Chapter 9's harness: DeepSpeed 0.19.8's own batch resolution, on one rank, for Task 9.1's check.

The rank function runs under ``zero_ref.launch`` (cloudpickle sends it by name, so the child imports this
module).
"""
from course.labs.deepspeed_cpu import import_deepspeed


class DataParallel:
    """An mpu: DeepSpeed's config takes the data-parallel size from ``get_data_parallel_world_size``."""

    def __init__(self, dp):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp


def deepspeed_batches(rank, world_size, cases):
    """DeepSpeed 0.19.8's DeepSpeedConfig on each (batch keys, dp): the resolved triple, or its refusal."""
    deepspeed = import_deepspeed()
    from deepspeed.runtime.config import DeepSpeedConfig
    deepspeed.init_distributed(dist_backend="gloo")                  # DeepSpeedConfig asks for a rank first
    out = []
    for keys, dp in cases:
        try:
            c = DeepSpeedConfig(dict(keys), mpu=DataParallel(dp))
            out.append((c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps))
        except AssertionError as e:
            out.append(f"refused: {e}")
    return out
