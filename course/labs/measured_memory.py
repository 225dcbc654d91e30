"""Memory measured on real ranks (chapter 29): the model-state bytes each ZeRO stage leaves on a rank, and a
plan's peak during a step, for comparison with the formulas and predictions a chapter writes."""
from __future__ import annotations

import torch

from zero_ref.measure import PeakTensorBytes, unique_storage_bytes
from zero_ref.models import GPT, Block, make_batch
from zero_ref.stages import STAGES


def held_bytes(rank, world_size, cfg):
    """Per ZeRO stage 0-3 after one bf16 step of ``GPT(cfg)``: this rank's tensor bytes by state category, and Ψ."""
    out = {}
    for stage in range(4):
        torch.manual_seed(0)
        model = GPT(cfg)
        knobs = {"param_persistence_threshold": 0} if stage == 3 else {}   # partition every parameter
        opt = STAGES[stage](model, precision="bf16", **knobs)
        idx, targets = make_batch(cfg, 2 * world_size, seed=0)
        opt.backward(model(idx[2 * rank:2 * rank + 2], targets[2 * rank:2 * rank + 2])[1])
        opt.step()
        out[stage] = {cat: unique_storage_bytes(ts) for cat, ts in opt.state_tensors().items()}
        out[stage]["psi"] = sum(p.numel() for p in model.parameters())
    return out


def peak_bytes(rank, world_size, cfg, plans):
    """Per plan ({name: {"stage", "micro_batch", "gas"}}, fp32): (bytes of model states held between steps, peak
    bytes allocated during a step and still alive)."""
    out = {}
    for name, plan in plans.items():
        torch.manual_seed(0)
        model = GPT(cfg)
        knobs = {"unit_modules": (Block,)} if plan["stage"] == 3 else {}   # as chapter 28's profile runs it
        opt = STAGES[plan["stage"]](model, overlap_comm=False, gradient_accumulation_steps=plan["gas"], **knobs)
        mb, gas, peaks = plan["micro_batch"], plan["gas"], []
        for step in range(3):   # step 0 creates Adam's moments; steps 1 and 2 are alike
            idx, targets = make_batch(cfg, mb * gas * world_size, seed=step)
            held = unique_storage_bytes([t for ts in opt.state_tensors().values() for t in ts])
            with PeakTensorBytes() as during:
                for micro in range(gas):
                    start = (micro * world_size + rank) * mb
                    opt.backward(model(idx[start:start + mb], targets[start:start + mb])[1])
                    opt.step()
            peaks.append(during.peak)
        out[name] = (held, min(peaks[1:]))   # gloo's thread may let go of a finished buffer a moment late (Task 5.3)
    return out
