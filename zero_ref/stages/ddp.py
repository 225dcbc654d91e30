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
        b.flat_grad = torch.zeros_like(b.flat_param)
        for p, g in zip(b.params, b.layout.unflatten(b.flat_grad)):
            p.grad = g  # autograd accumulates into the flat buffer
        b.master = self.master_shard(b, masters, full=True)
        b.exp_avg = torch.zeros_like(b.master, dtype=torch.float32)
        b.exp_avg_sq = torch.zeros_like(b.master, dtype=torch.float32)

    def reduce_bucket(self, b: Bucket) -> None:
        self._async(comm.all_reduce(b.flat_grad, group=self.group, async_op=self.overlap_comm))

    def grads_are_sharded(self) -> bool:
        return False  # every rank holds the same full gradient: no collective needed for the norm

    def grad_shards(self) -> list[torch.Tensor]:
        # .float() is the tensor itself in fp32 and a copy otherwise; gradients are zeroed after the step.
        return [b.flat_grad.float().mul_(1.0 / self.world_size) for b in self.buckets]

    def publish_params(self) -> None:
        for b in self.buckets:
            if b.master.data_ptr() != b.flat_param.data_ptr():
                b.flat_param.copy_(b.master)

    def clear_grads(self) -> None:
        for b in self.buckets:
            b.flat_grad.zero_()
