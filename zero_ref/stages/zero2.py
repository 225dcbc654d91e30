"""ZeRO-2 (P_os+g): partition the gradients too.

No rank ever holds a full gradient buffer. As backward produces a parameter's gradient, it is
copied into its bucket's staging buffer and freed; when a bucket is complete it is
reduce-scattered and each rank adds only its shard into a persistent gradient partition. This
happens on every micro-step (accumulation happens in the partition), so gradient memory per
rank is Ψ/N plus one bucket in flight: 2Ψ + 14Ψ/N bytes at rest in mixed precision.
"""
import torch

from zero_ref import comm
from zero_ref.stages.base import Bucket, ZeroOptimizerBase


class ZeroStage2(ZeroOptimizerBase):
    stage = 2

    def reduces_this_micro_step(self) -> bool:
        return True  # every micro-step: there is no full buffer to accumulate into

    def init_bucket(self, b: Bucket, masters: dict) -> None:
        # (ZeRO-Offload puts the partition on the host, its gradient shard in fp32)
        b.partition = self.new_partition(b, self.master_shard(b, masters, full=False), grad=True)

    def on_grad_ready(self, b: Bucket, i: int, param: torch.Tensor) -> None:
        if b.staging is None:
            b.staging = torch.zeros_like(b.flat_param)
        start, n = b.layout.offsets[i], b.layout.numels[i]
        b.staging[start:start + n].copy_(param.grad.reshape(-1))
        param.grad = None  # the full gradient is freed as soon as it is staged

    def reduce_bucket(self, b: Bucket) -> None:
        staging = b.staging if b.staging is not None else torch.zeros_like(b.flat_param)
        b.staging = None
        mine = b.shard(staging)
        work = comm.reduce_scatter(mine, staging, group=self.group, async_op=self.overlap_comm)
        if self.offload is not None:
            def then():  # to the host, into the fp32 gradient partition
                self.offload.add_grad(b.partition, mine)
        else:
            def then():  # accumulates over micro-steps
                b.partition.grad.add_(mine)
        self._async(work, then)

    def grad_shards(self) -> list[torch.Tensor]:
        if self.offload is not None:
            return self.offload.grad_partitions([b.partition for b in self.buckets], 1.0 / self.world_size)
        return [self.averaged(b.partition.grad) for b in self.buckets]

    def clear_grads(self) -> None:
        for b in self.buckets:
            b.partition.grad.zero_()
