"""ZeRO-Infinity's parameter half: ZeRO-3 units' 16-bit partitions on the host or in NVMe files between uses."""
from __future__ import annotations

import torch

from zero_ref.config.schema import OffloadParamConfig
from zero_ref.offload.link import Link


class ParamOffload:
    """ZeRO-3 units' 16-bit partitions on the host (``"cpu"``) or in NVMe files (``"nvme"``) between uses.

    A unit with ``unit.offload = self`` asks ``fetch`` for its partition on the device before an
    all-gather, and hands updated values to ``write_part``."""

    def __init__(self, cfg: OffloadParamConfig, link: Link):
        self.cfg, self.link, self.nvme = cfg, link, cfg.device == "nvme"
        self.store = None
        self.units: list = []  # the units adopted
        self._keys: dict[int, str] = {}  # id(unit) -> its file's name in the store

    def key(self, u) -> str:
        return self._keys[id(u)]

    def adopt(self, u) -> None:
        """Move unit ``u``'s partition to the host (cpu) — or mark it for the store (nvme, in ``attach``)."""
        if self.nvme and u.layout.shard_numel > self.cfg.buffer_size:
            raise ValueError(f"zero_optimization.offload_param.buffer_size={self.cfg.buffer_size} is smaller than "
                             f"the partition of '{u.name}' ({u.layout.shard_numel} elements)")
        host = self.link.host_zeros(u.layout.shard_numel, u.part.dtype)
        host.copy_(u.part)
        u.part, u.offload = host, self
        self._keys[id(u)] = f"param{len(self.units)}"
        self.units.append(u)

    def file_bytes_needed(self) -> int:
        return 2 * sum(u.part.numel() * u.part.element_size() for u in self.units)

    def attach(self, store) -> None:
        """NVMe: write every adopted unit's partition into ``store``'s open version; keep none in memory."""
        self.store = store
        for u in self.units:
            if self.nvme:
                store.write(self.key(u), u.part)  # (the write holds the storage until it is done)
                u.part = u.part.new_empty(0)  # dtype kept; the values are in the file

    def fetch(self, u) -> torch.Tensor:
        """Unit ``u``'s partition on the compute device (the all-gather's input)."""
        if self.nvme:
            host = self.link.host_zeros(u.layout.shard_numel, u.part.dtype)
            self.store.read(self.key(u), host).result()
        else:
            host = u.part
        self.link.h2d_bytes += host.numel() * host.element_size()
        return host.to(u.device, non_blocking=True)

    def write_part(self, u, values: torch.Tensor) -> None:
        """Updated values for ``u``'s partition: into the host copy, or a new file version (NVMe)."""
        if not self.nvme:
            u.part.copy_(values)
            return
        new = torch.empty(u.layout.shard_numel, dtype=u.part.dtype).copy_(values)
        if self.store.is_open:  # inside the optimizer step's version
            self.store.write(self.key(u), new)
        else:  # e.g. GatheredParameters(modifier_rank=...): a version of its own
            self.store.begin()
            self.store.write(self.key(u), new)
            self.store.commit()

    def host_tensors(self) -> list[torch.Tensor]:
        return [u.part for u in self.units if u.part.numel()]
