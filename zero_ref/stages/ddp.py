"""Stage 0: plain data parallelism, the baseline ZeRO improves on.

Every rank keeps everything: full parameters, full gradients, full fp32 master weights and Adam
states (16Ψ bytes in mixed precision). Gradients accumulate in one flat buffer per bucket
(``param.grad`` views into it); on the last micro-step of an accumulation window each bucket is
all-reduced as soon as backward has filled it, overlapping communication with the rest of
backward (``overlap_comm``), like PyTorch DDP.
"""
import torch

from zero_ref import comm
from zero_ref.stages.base import Bucket, ZeroOptimizerBase


class DataParallel(ZeroOptimizerBase):
    stage = 0

    def init_bucket(self, b: Bucket, masters: dict) -> None:
        self.attach_flat_grad(b)  # autograd accumulates into the flat buffer
        b.partition = self.new_partition(b, self.master_shard(b, masters, full=True), grad=False)

    def reduce_bucket(self, b: Bucket) -> None:
        self._async(comm.all_reduce(b.flat_grad, group=self.group, async_op=self.overlap_comm))

    def grads_are_sharded(self) -> bool:
        return False  # every rank holds the same full gradient: no collective needed for the norm

    def grad_shards(self) -> list[torch.Tensor]:
        return [self.averaged(b.flat_grad) for b in self.buckets]

    def publish_params(self) -> None:
        for b in self.buckets:
            if b.partition.master.data_ptr() != b.flat_param.data_ptr():  # mixed precision: cast down
                b.flat_param.copy_(b.partition.master)

    def clear_grads(self) -> None:
        for b in self.buckets:
            b.flat_grad.zero_()
