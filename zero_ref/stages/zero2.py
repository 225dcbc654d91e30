"""ZeRO-2 (P_os+g): partition the gradients too.

No rank ever holds a full gradient buffer. As backward produces a parameter's gradient, it is
copied into its bucket's staging buffer and freed; when a bucket is complete it is
reduce-scattered and each rank adds only its shard into a persistent gradient partition
(``GradientShards``, which ZeRO-3 uses too). This happens on every micro-step (accumulation happens
in the partition), so gradient memory per rank is Ψ/N plus one bucket in flight: 2Ψ + 14Ψ/N bytes
at rest in mixed precision.
"""
import torch

from zero_ref.stages.base import Bucket, ZeroOptimizerBase
from zero_ref.stages.gradient_shards import GradientShards


class ZeroStage2(ZeroOptimizerBase):
    stage = 2

    def __init__(self, module, **kwargs):  # (ZeroOptimizerBase's keywords)
        self.grads = GradientShards(self)
        super().__init__(module, **kwargs)

    def reduces_this_micro_step(self) -> bool:
        return True  # every micro-step: there is no full buffer to accumulate into

    def init_bucket(self, b: Bucket, masters: dict) -> None:
        # (ZeRO-Offload puts the partition on the host, its gradient shard in fp32)
        b.partition = self.new_partition(b, self.master_shard(b, masters, full=False), grad=True)

    def on_grad_ready(self, b: Bucket, i: int, param: torch.Tensor) -> None:
        self.grads.stage(b, i, param)  # into b's staging buffer; param.grad is freed

    def reduce_bucket(self, b: Bucket) -> None:
        staging = self.grads.take(b, b.flat_param.dtype, b.flat_param.device)
        self.grads.reduce(staging, into=[(b.partition, 0)])  # this rank's shard, into its partition

    def grad_shards(self) -> list[torch.Tensor]:
        return self.grads.averaged([b.partition for b in self.buckets])

    def clear_grads(self) -> None:
        self.grads.clear([b.partition for b in self.buckets])
