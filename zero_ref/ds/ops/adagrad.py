"""``deepspeed.ops.adagrad``'s optimizer, as torch's Adagrad.

DeepSpeed's ``DeepSpeedCPUAdagrad`` (a vectorised CPU kernel, csrc/adagrad/cpu_adagrad.cpp) adds
``weight_decay · param`` to the gradient, the squared gradient to its sum, and steps
``param -= lr · grad / (sqrt(sum) + eps)``: torch's ``Adagrad`` with ``lr_decay`` 0 and
``initial_accumulator_value`` 0, which this class is, with DeepSpeed's signature and defaults. The engine
runs its own step on the partitions, as it runs any client optimizer (its state: torch's ``sum`` and
``step``, where DeepSpeed's kernel names them ``exp_avg_sq`` and ``step``).
"""
from __future__ import annotations

import torch

__all__ = ["DeepSpeedCPUAdagrad"]


class DeepSpeedCPUAdagrad(torch.optim.Adagrad):
    """DeepSpeed's ``deepspeed.ops.adagrad.DeepSpeedCPUAdagrad``, run as torch's Adagrad."""

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False, fp32_optimizer_states=True):
        if amsgrad:
            raise ValueError("DeepSpeedCPUAdagrad(amsgrad=True): Adagrad has no AMSGrad variant (DeepSpeed's kernel "
                             "ignores the flag); leave it False")
        if not fp32_optimizer_states:
            raise ValueError("DeepSpeedCPUAdagrad(fp32_optimizer_states=False) is not supported by zero_ref: the "
                             "optimizer's state is fp32")
        super().__init__(model_params, lr=lr, eps=eps, weight_decay=weight_decay)
