"""Agreement of a backend with torch.optim.AdamW (or Adam with L2) over several steps."""
from __future__ import annotations

import json
import sys

import torch

from zero_ref.kernels.adam import adam_step
from zero_ref.optim import AdamConfig


def compare_with_torch(backend: str, sizes=(1, 7, 1000), steps: int = 10, adamw: bool = True, lr: float = 1e-2,
                       weight_decay: float = 0.1, device: str = "cpu", seed: int = 0, step_fn=None,
                       foreach: bool | None = None, grad_scale: float = 1.0) -> dict:
    """Step the same random tensors with ``torch.optim`` and with ``adam_step(backend=...)``.

    ``step_fn(params, grads, exp_avgs, exp_avg_sqs, step, cfg)`` replaces ``adam_step`` (to check
    a student's kernel); ``foreach`` picks torch's implementation (None: its default for the device);
    the gradients are ``grad_scale`` times standard normal (small ones make ε matter). Returns ``max_rel_error`` (the largest ``max|p - p_ref| / max|p_ref|``
    over the tensors), ``moments_rel_error`` (the same over exp_avg and exp_avg_sq), and bit-for-bit
    equality: ``exp_avg_equal``, ``exp_avg_sq_equal``, ``moments_equal`` (both) and ``params_equal``.
    """
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(n, generator=gen).to(device) for n in sizes]
    ref = [p.clone().requires_grad_() for p in params]
    opt = (torch.optim.AdamW if adamw else torch.optim.Adam)(ref, lr=lr, weight_decay=weight_decay, foreach=foreach)
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    cfg = AdamConfig(lr=lr, weight_decay=weight_decay, adamw=adamw)
    for step in range(1, steps + 1):
        grads = [(torch.randn(n, generator=gen) * grad_scale).to(device) for n in sizes]
        for r, g in zip(ref, grads):
            r.grad = g.clone()
        opt.step()
        if step_fn is None:
            adam_step(params, grads, ms, vs, step, cfg, backend=backend)
        else:
            step_fn(params, grads, ms, vs, step, cfg)
    states = [opt.state[r] for r in ref]
    ref = [r.detach() for r in ref]
    exp_avg_equal = all(torch.equal(m, st["exp_avg"]) for m, st in zip(ms, states))
    exp_avg_sq_equal = all(torch.equal(v, st["exp_avg_sq"]) for v, st in zip(vs, states))
    return {
        "max_rel_error": max(_rel(p, r) for p, r in zip(params, ref)),
        "moments_rel_error": max(max(_rel(m, st["exp_avg"]), _rel(v, st["exp_avg_sq"]))
                                 for m, v, st in zip(ms, vs, states)),
        "exp_avg_equal": exp_avg_equal,
        "exp_avg_sq_equal": exp_avg_sq_equal,
        "moments_equal": exp_avg_equal and exp_avg_sq_equal,
        "params_equal": all(torch.equal(p, r) for p, r in zip(params, ref)),
    }


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).abs().max() / ref.abs().max()).item()


def numba_cuda_in_the_simulator(sizes, steps, seed) -> dict:
    """``numba_cuda.simulate``'s run, in the process it starts with ``NUMBA_ENABLE_CUDASIM=1``."""
    result = {"sizes": list(sizes), "steps": steps}
    for mode, adamw in (("adamw", True), ("adam_l2", False)):
        result[mode] = compare_with_torch("numba_cuda", sizes, steps, adamw=adamw, seed=seed)["max_rel_error"]
    return result


if __name__ == "__main__":
    print(json.dumps(numba_cuda_in_the_simulator(**json.loads(sys.argv[1]))))
