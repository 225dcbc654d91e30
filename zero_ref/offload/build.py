"""Building a stage's offload from DeepSpeed's config sections, and measuring where its bytes are."""
from __future__ import annotations

import torch

from zero_ref.config import offload_sections
from zero_ref.measure import storage_key, unique_storage_bytes
from zero_ref.offload.link import Link
from zero_ref.offload.optimizer import CPU_ADAM, OptimizerOffload
from zero_ref.offload.params import ParamOffload


def parse_configs(stage: int, offload_optimizer=None, offload_param=None, aio=None):
    """Check DeepSpeed's offload rules for ``stage``; returns (optimizer config, param config, aio config).

    The sections' keys, defaults (DeepSpeed 0.19.8's) and rules live in zero_ref.config; a problem is a
    ``zero_ref.config.ConfigError`` (a ValueError) naming the key."""
    return offload_sections(stage, offload_optimizer, offload_param, aio)


def make(stage: int, *, device, offload_optimizer=None, offload_param=None, aio=None, sub_group_size=int(1e9),
         cpu_adam: str = "numba", rank: int = 0, world_size: int = 1):
    """The stage's (OptimizerOffload or None, ParamOffload or None), after checking DeepSpeed's rules."""
    opt_cfg, par_cfg, io = parse_configs(stage, offload_optimizer, offload_param, aio)
    if cpu_adam not in CPU_ADAM:
        raise ValueError(f"cpu_adam must be one of {', '.join(CPU_ADAM)}, got {cpu_adam!r}")
    opt = None
    if opt_cfg.device != "none":
        opt = OptimizerOffload(opt_cfg, device=device, cpu_adam=cpu_adam, aio=io, sub_group_size=sub_group_size,
                               rank=rank, world_size=world_size)
    par = None
    if par_cfg.device != "none":
        par = ParamOffload(par_cfg, opt.link if opt is not None else Link(device, par_cfg.pin_memory))
    return opt, par


def tier_bytes(opt) -> dict[str, dict[str, int]]:
    """Bytes this rank holds per tier and category, measured: storage bytes of the tensors on the device
    ("gpu") and on the host ("cpu"), file sizes on disk ("nvme"). Same keys as ``memory.offload_placement``;
    the NVMe step's swap buffers (transient, not model states) are reported apart as ``cpu_buffers``."""
    host = []
    if opt.offload is not None:
        host += opt.offload.host_tensors(opt.buckets)
    if getattr(opt, "param_offload", None) is not None:
        host += opt.param_offload.host_tensors()
    host_keys = {storage_key(t) for t in host}
    out = {tier: dict.fromkeys(("params", "grads", "optimizer"), 0) for tier in ("gpu", "cpu", "nvme")}
    for category, tensors in opt.state_tensors().items():
        on_host = [t for t in tensors if storage_key(t) in host_keys]
        on_device = [t for t in tensors if storage_key(t) not in host_keys]
        if torch.cuda.is_available():  # the logical tier must be the physical one
            assert all(t.device.type == "cpu" for t in on_host), category
        out["cpu"][category] = unique_storage_bytes(on_host)
        out["gpu"][category] = unique_storage_bytes(on_device)
    store = opt.offload.store if opt.offload is not None else None
    if store is not None:
        out["nvme"]["optimizer"] = store.file_bytes("optim")
        out["nvme"]["params"] = store.file_bytes("param")
    out["cpu_buffers"] = unique_storage_bytes(opt.offload.buffer_tensors()) if opt.offload is not None else 0
    return out
