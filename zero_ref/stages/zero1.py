"""ZeRO-1 (P_os): partition the optimizer states.

Gradients still accumulate in full on every rank (as in data parallelism), but each rank keeps
fp32 master weights and Adam moments for its shard only: 4Ψ + 12Ψ/N bytes in mixed precision.
At the accumulation boundary each bucket's gradient is reduce-scattered (rank r receives the sum
of shard r), each rank steps its shard, and the updated parameters are all-gathered: Ψ + Ψ
elements on the wire per rank, the same as one all-reduce.
"""
import torch

from zero_ref import comm
from zero_ref.stages.base import Bucket, ZeroOptimizerBase


class ZeroStage1(ZeroOptimizerBase):
    stage = 1

    def init_bucket(self, b: Bucket, masters: dict) -> None:
        b.flat_grad = torch.zeros_like(b.flat_param)
        for p, g in zip(b.params, b.layout.unflatten(b.flat_grad)):
            p.grad = g
        b.master = self.master_shard(b, masters, full=False)
        if self.offload is not None:  # ZeRO-Offload: master, moments and an fp32 gradient shard on the host
            return self.offload.adopt(b)
        b.exp_avg = torch.zeros_like(b.master, dtype=torch.float32)
        b.exp_avg_sq = torch.zeros_like(b.master, dtype=torch.float32)

    def reduce_bucket(self, b: Bucket) -> None:
        # In place: this rank's shard of the flat gradient receives the sum over ranks.
        mine = b.shard(b.flat_grad)
        work = comm.reduce_scatter(mine, b.flat_grad, group=self.group, async_op=self.overlap_comm)
        self._async(work, (lambda: self.offload.add_grad(b, mine)) if self.offload else None)  # offload: to the host

    def grad_shards(self) -> list[torch.Tensor]:
        if self.offload is not None:
            return self.offload.grad_partitions(self.buckets, 1.0 / self.world_size)
        # .float() is the tensor itself in fp32 and a copy otherwise; gradients are zeroed after the step.
        return [b.shard(b.flat_grad).float().mul_(1.0 / self.world_size) for b in self.buckets]

    def clear_grads(self) -> None:
        for b in self.buckets:
            b.flat_grad.zero_()
        if self.offload is not None:
            self.offload.zero_grads(self.buckets)
