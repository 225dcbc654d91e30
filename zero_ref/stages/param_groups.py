"""Param groups: torch-style groups of parameters, each with its own Adam(W) hyper-parameters.

Every stage steps each group's span of its optimizer state with that group's values, which a
learning-rate schedule may change between steps.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from zero_ref.optim import AdamConfig

HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")  # what a param group may set for itself


def trainable_params(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that need gradients, each once (tied weights appear once), in registration order."""
    return [p for p in module.parameters() if p.requires_grad]


def param_groups_for(module: nn.Module, groups, adam: AdamConfig) -> tuple[list[dict], dict[int, int]]:
    """torch-style param groups over the module's trainable parameters, and parameter id → group index.

    ``groups`` is None (one group of everything, with ``adam``'s values) or a list of dicts, each with
    ``"params"`` and any of lr, betas, eps, weight_decay (a key it leaves out takes ``adam``'s value), as
    torch.optim and DeepSpeed's ``model_parameters`` take them. Every trainable parameter is in exactly
    one group. Each returned dict holds its parameters and all four values, and is what a learning-rate
    schedule writes: the step reads it."""
    trainable = trainable_params(module)
    if groups is None:
        groups = [{"params": trainable}]
    if isinstance(groups, dict) or not all(isinstance(g, dict) and "params" in g for g in groups):
        raise ValueError("param_groups must be a list of dicts, each with a 'params' entry")
    out, group_of = [], {}
    for i, g in enumerate(groups):
        params = [g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"])
        for key in ("amsgrad", "maximize"):
            if g.get(key):
                raise ValueError(f"param group {i}: {key}=True is not supported (zero_ref steps plain Adam(W))")
        for p in params:
            if id(p) in group_of:
                raise ValueError(f"param group {i}: a parameter of shape {tuple(p.shape)} is also in group "
                                 f"{group_of[id(p)]}; each parameter belongs to one group")
            group_of[id(p)] = i
        values = {k: g.get(k, getattr(adam, k)) for k in HYPERPARAMETERS}
        values["betas"] = tuple(values["betas"])
        group_adam(values, adam)  # validates the values now, not at the first step
        out.append({**g, "params": params, **values})
    stray = [p for p in group_of if p not in {id(t) for t in trainable}]
    missing = [tuple(p.shape) for p in trainable if id(p) not in group_of]
    if stray or missing:
        raise ValueError(f"param_groups must hold exactly the module's trainable parameters: "
                         f"{len(missing)} missing (shapes {missing[:3]}), {len(stray)} not trainable or not the module's")
    return out, group_of


def group_adam(group: dict, adam: AdamConfig) -> AdamConfig:
    """The Adam(W) hyper-parameters of one param group (``adam`` gives the update rule, Adam or AdamW)."""
    return AdamConfig(lr=float(group["lr"]), betas=tuple(group["betas"]), eps=float(group["eps"]),
                      weight_decay=float(group["weight_decay"]), adamw=adam.adamw)
