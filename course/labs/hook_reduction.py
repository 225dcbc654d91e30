"""A gradient reduction through a communication hook, outside training: one rank's real gradients of the course
GPT laid into one bucket, reduced once by ``hook(bucket, group)``, against the exact average over the ranks."""
from __future__ import annotations

import torch

from zero_ref import comm
from zero_ref.models import GPT, make_batch
from zero_ref.stages.base import Bucket


def rank_gradients(cfg, rank: int, world: int, batch: int = 4) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(this rank's gradients of ``GPT(cfg)`` (seed 0) on ``make_batch(cfg, batch, seed=rank)``, the fp32
    average of every rank's, flattened): each rank computes all of them, so the average is exact."""
    torch.manual_seed(0)
    model = GPT(cfg)

    def grads(r):
        model.zero_grad()
        model(*make_batch(cfg, batch, seed=r))[1].backward()
        return [p.grad.clone() for p in model.parameters()]

    mine = grads(rank)
    every = [grads(r) for r in range(world)]
    average = [sum(gs) / world for gs in zip(*every)]
    return mine, torch.cat([g.reshape(-1) for g in average])


def reduce_once(hook, grads: list[torch.Tensor], world: int, rank: int, group=None, index: int = 0):
    """(what ``hook`` left in bucket ``index`` holding ``grads``, flattened; the ``comm.recording()`` of its calls)."""
    b = Bucket(index, [torch.nn.Parameter(torch.zeros_like(g)) for g in grads], world, rank)
    b.flat_grad = torch.zeros_like(b.flat_param)
    for view, g in zip(b.layout.unflatten(b.flat_grad), grads):
        view.copy_(g)
    with comm.recording() as log:
        hook(b, group)
    return torch.cat([v.reshape(-1) for v in b.layout.unflatten(b.flat_grad)]), log
