"""``deepspeed.ops.adam``'s optimizers, as the Adam(W) zero_ref's stages run.

A script builds ``FusedAdam(params, lr=...)`` or ``DeepSpeedCPUAdam(params, ...)`` and passes it to
``initialize(optimizer=...)``; the engine reads its hyper-parameters and param groups and its stage
steps Adam(W) on its own partitions (zero_ref.optim.adam_step_), as DeepSpeed steps its kernels. Both
are ``torch.optim.AdamW`` with DeepSpeed's signatures and defaults (``weight_decay`` 0, decoupled
weight decay: ``adam_w_mode`` / ``adamw_mode`` True), so one built outside the engine steps as
DeepSpeed's would. As in DeepSpeed, ZeRO-Offload takes a ``DeepSpeedCPUAdam`` client optimizer
without ``"zero_force_ds_cpu_optimizer": false``.

Refused, with the way out: ``amsgrad`` (DeepSpeed's FusedAdam refuses it too), ``bias_correction=False``
and the L2 mode (``adam_w_mode=False``: use ``torch.optim.Adam``, which the engine runs as Adam with L2).
"""
from __future__ import annotations

import torch

__all__ = ["FusedAdam", "DeepSpeedCPUAdam"]


def _check(name: str, amsgrad: bool, bias_correction: bool, adamw: bool, mode_key: str) -> None:
    if amsgrad:
        raise RuntimeError(f"{name} does not support the AMSGrad variant (DeepSpeed's {name} refuses it too)")
    if not bias_correction:
        raise ValueError(f"{name}(bias_correction=False) is not supported by zero_ref: its Adam always corrects the "
                         "bias (DeepSpeed's kernels can skip it); leave bias_correction=True")
    if not adamw:
        raise ValueError(f"{name}({mode_key}=False) is Adam with L2 weight decay: use torch.optim.Adam(...) with "
                         "zero_ref, which its stages run as DeepSpeed runs that mode")


class FusedAdam(torch.optim.AdamW):
    """DeepSpeed's ``deepspeed.ops.adam.FusedAdam`` (a CUDA kernel there), run as torch's AdamW here."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True):
        _check("FusedAdam", amsgrad, bias_correction, adam_w_mode, "adam_w_mode")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class DeepSpeedCPUAdam(torch.optim.AdamW):
    """DeepSpeed's ``deepspeed.ops.adam.DeepSpeedCPUAdam`` (a vectorised CPU kernel there), run as torch's
    AdamW here; with ZeRO-Offload the stage steps it on the host (zero_ref.offload)."""

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        _check("DeepSpeedCPUAdam", amsgrad, bias_correction, adamw_mode, "adamw_mode")
        if not fp32_optimizer_states:
            raise ValueError("DeepSpeedCPUAdam(fp32_optimizer_states=False) is not supported by zero_ref: Adam's "
                             "moments are always fp32")
        super().__init__(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
