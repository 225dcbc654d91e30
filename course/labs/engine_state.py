"""An engine's state read back on every rank without the checkpoint code (chapter 27), so that a loaded
checkpoint can be compared with what was saved."""
from __future__ import annotations

import torch

from zero_ref import comm


def full_state(engine) -> dict:
    """Full fp32 parameters, {name: tensor} (stage 3 gathers them: a collective, every rank calls it)."""
    opt = engine.optimizer
    state = opt.state_dict() if opt.stage == 3 else engine.module.state_dict()
    return {k: v.detach().float().clone() for k, v in state.items()}


def gathered_masters(engine) -> dict:
    """The fp32 master weights, {name: tensor}, all-gathered from every rank's partition (a collective)."""
    opt = engine.optimizer
    names = {id(p): n for n, p in engine.module.named_parameters()}
    out = {}
    for b in opt.buckets:
        flat = b.partition.master
        if opt.stage > 0 and opt.world_size > 1:
            flat = torch.empty(b.layout.padded_numel)
            comm.all_gather(flat, b.partition.master, group=opt.group)
        out.update({names[id(p)]: t.clone() for p, t in zip(b.params, b.layout.unflatten(flat))})
    return out
