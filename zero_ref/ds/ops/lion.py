"""``deepspeed.ops.lion``'s optimizers, in torch.

Lion's step as DeepSpeed's kernels take it (csrc/includes/cpu_lion.h, ``Step_AVX``; the scalar path in
csrc/lion/cpu_lion_impl.cpp)::

    c = β1·m + (1 − β1)·g
    p = p·(1 − lr·wd) − lr·sign(c)             (decoupled weight decay)
    m = β2·m + (1 − β2)·g

At c = 0 the kernels part: the CPU one takes copysign(1, c) (+0 steps by −lr), the CUDA one
(csrc/lion/multi_tensor_lion.cu) steps by +lr unless c > 0; each class here follows its own kernel.

``FusedLion`` (a CUDA kernel there) and ``DeepSpeedCPULion`` (a CPU kernel) are this class with DeepSpeed's
signatures and defaults; the state is one fp32 ``exp_avg`` per tensor, as DeepSpeed's. The engine runs
their own step on its partitions, as it runs any client optimizer.
"""
from __future__ import annotations

import torch

__all__ = ["FusedLion", "DeepSpeedCPULion"]


class _Lion(torch.optim.Optimizer):
    @staticmethod
    def _sign(c: torch.Tensor) -> torch.Tensor:
        return torch.copysign(torch.ones_like(c), c)

    def __init__(self, params, lr, betas, weight_decay):
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"betas must be in [0, 1), got {tuple(betas)}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            (b1, b2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                m = state["exp_avg"]
                c = m * b1 + g * (1 - b1)
                if wd > 0:
                    p.mul_(1 - lr * wd)
                p.add_(self._sign(c), alpha=-lr)
                m.mul_(b2).add_(g, alpha=1 - b2)
        return loss


class FusedLion(_Lion):
    """DeepSpeed's ``deepspeed.ops.lion.FusedLion``."""

    @staticmethod
    def _sign(c: torch.Tensor) -> torch.Tensor:
        return torch.where(c > 0, 1.0, -1.0).to(c.dtype)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0., set_grad_none=True):
        super().__init__(params, lr, betas, weight_decay)


class DeepSpeedCPULion(_Lion):
    """DeepSpeed's ``deepspeed.ops.lion.DeepSpeedCPULion``."""

    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0, fp32_optimizer_states=True):
        if not fp32_optimizer_states:
            raise ValueError("DeepSpeedCPULion(fp32_optimizer_states=False) is not supported by zero_ref: the "
                             "optimizer's state is fp32")
        super().__init__(model_params, lr, betas, weight_decay)
