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
        b.staging = None
        b.master = self.master_shard(b, masters, full=False)
        if self.offload is not None:  # ZeRO-Offload: master, moments and the gradient shard (fp32) on the host
            return self.offload.adopt(b)
        b.grad_shard = torch.zeros(b.layout.shard_numel, dtype=self.dtype, device=b.flat_param.device)
        b.exp_avg = torch.zeros_like(b.master, dtype=torch.float32)
        b.exp_avg_sq = torch.zeros_like(b.master, dtype=torch.float32)

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
        self._async(work, lambda: self.offload.add_grad(b, mine) if self.offload else b.grad_shard.add_(mine))

    def grad_shards(self) -> list[torch.Tensor]:
        if self.offload is not None:
            return self.offload.grad_partitions(self.buckets, 1.0 / self.world_size)
        # .float() is the tensor itself in fp32 and a copy otherwise; gradients are zeroed after the step.
        return [b.grad_shard.float().mul_(1.0 / self.world_size) for b in self.buckets]

    def clear_grads(self) -> None:
        for b in self.buckets:
            b.grad_shard.zero_()
