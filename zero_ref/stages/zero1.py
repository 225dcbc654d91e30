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
        self.attach_flat_grad(b)  # autograd accumulates into the flat buffer
        # (ZeRO-Offload puts the partition on the host, with an fp32 gradient shard to add the reductions into)
        b.partition = self.new_partition(b, self.master_shard(b, masters, full=False), grad=False)

    def reduce_bucket(self, b: Bucket) -> None:
        # In place: this rank's shard of the flat gradient receives the sum over ranks.
        mine = b.shard(b.flat_grad)
        work = comm.reduce_scatter(mine, b.flat_grad, group=self.group, async_op=self.overlap_comm)
        then = None
        if self.offload is not None:  # to the host, into the fp32 gradient partition
            def then():
                self.offload.add_grad(b.partition, mine)
        self._async(work, then)

    def reopen_reduced(self) -> None:
        if self.offload is None:
            return super().reopen_reduced()
        for b in self.buckets:  # offload: the sum went into the host's fp32 partition already
            b.flat_grad.zero_()

    def grad_shards(self) -> list[torch.Tensor]:
        if self.offload is not None:
            return self.offload.grad_partitions([b.partition for b in self.buckets], 1.0 / self.world_size)
        return [self.averaged(b.shard(b.flat_grad)) for b in self.buckets]

    def clear_grads(self) -> None:
        for b in self.buckets:
            b.flat_grad.zero_()
            if b.partition.grad is not None:  # offload: the host's fp32 gradient partition
                b.partition.grad.zero_()
