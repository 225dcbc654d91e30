"""DeepSpeed's ``deepspeed.moe.utils``: expert parameters in optimizer groups of their own."""
from __future__ import annotations

__all__ = ["is_moe_param", "split_params_into_different_moe_groups_for_optimizer", "is_moe_param_group"]


def is_moe_param(param) -> bool:
    """An expert's parameter (``zero_ref.ds.moe.layer.MoE`` marks them ``allreduce = False``, as DeepSpeed does)."""
    return hasattr(param, "allreduce") and not param.allreduce


def is_moe_param_group(param_group: dict) -> bool:
    return param_group.get("moe", False)


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size=178956971) -> list[dict]:
    """Each group's expert parameters moved into groups of their own (one per expert group name, with the
    group's hyper-parameters, ``"moe": True``, and at most ``max_group_size`` elements each), after the
    groups they came from — DeepSpeed's function, step for step; every group needs a ``"name"``."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")
    names = {p.group_name for g in param_groups for p in g["params"] if is_moe_param(p)}
    for g in param_groups:
        if names and "name" not in g:
            raise ValueError("split_params_into_different_moe_groups_for_optimizer: every param group needs a 'name' "
                             "(DeepSpeed reads param_group['name'] too)")
    moe = {g["name"]: {n: {**g, "name": n, "moe": True, "params": []} for n in sorted(names)} for g in param_groups}
    for g in param_groups:
        dense = []
        for p in g["params"]:
            (moe[g["name"]][p.group_name]["params"] if is_moe_param(p) else dense).append(p)
        g["params"] = dense
    for by_name in moe.values():
        for group in by_name.values():
            if max_group_size is None:
                param_groups.append(group)
                continue
            chunks, cur, size = [], [], 0
            for p in group["params"]:
                n = p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                if size + n <= max_group_size:
                    cur.append(p)
                    size += n
                else:
                    chunks.append(cur)
                    cur, size = [p], n
            if cur:
                chunks.append(cur)
            param_groups.extend({**group, "params": chunk} for chunk in chunks)
    return param_groups
