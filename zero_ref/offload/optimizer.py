"""ZeRO-Offload's optimizer half: the rank's optimizer partition on the host (or in NVMe files), Adam there.

The fp32 master partition, both Adam moments and an fp32 gradient partition live on the host; a reduced
16-bit gradient shard is added in as each bucket completes, the step runs Adam on the host (Numba CPU Adam)
and copies the updated partition, cast to 16 bits, back into the device parameters. With NVMe the states
live in files and are swapped in sub-groups (``nvme.py``). The wing's overview is ``zero_ref.offload``.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

from zero_ref.config.schema import AioConfig, OffloadOptimizerConfig
from zero_ref.kernels import adam_update_
from zero_ref.offload import nvme
from zero_ref.offload.link import Link

if TYPE_CHECKING:  # (the stages build partitions; this module only places their tensors)
    from zero_ref.stages.partition import Partition

CPU_ADAM = ("numba", "torch")


class OptimizerOffload:
    """The rank's optimizer partition on the host (``device="cpu"``) or in NVMe files (``"nvme"``)."""

    def __init__(self, cfg: OffloadOptimizerConfig, *, device, cpu_adam: str = "numba", aio: AioConfig | None = None,
                 sub_group_size: int = int(1e9), rank: int = 0, world_size: int = 1):
        if cpu_adam not in CPU_ADAM:
            raise ValueError(f"cpu_adam must be one of {', '.join(CPU_ADAM)}, got {cpu_adam!r}")
        if sub_group_size < 1:
            raise ValueError(f"zero_optimization.sub_group_size must be >= 1, got {sub_group_size}")
        self.cfg, self.cpu_adam, self.aio = cfg, cpu_adam, aio or AioConfig()
        self.sub_group_size, self.rank, self.world_size = int(sub_group_size), rank, world_size
        self.link = Link(device, cfg.pin_memory)
        self.nvme = cfg.device == "nvme"
        self.store = self.swapper = None
        self.sub_groups: list[list] = []

    # -------------------------------------------------------- set-up
    def place(self, part: Partition) -> None:
        """Put a stage's new partition on the host: its master (copied, in fp32), zeroed Adam moments and a
        zeroed fp32 gradient partition that the reduced gradients are added into."""
        host = self.link.host_zeros(part.numel)
        host.copy_(part.master)
        part.master = host
        part.exp_avg, part.exp_avg_sq, part.grad = (self.link.host_zeros(part.numel) for _ in range(3))

    def attach(self, opt, buckets, param_offload=None) -> None:
        """After every bucket is adopted. NVMe: form sub-groups, check ``nvme_path``, write version 1 of the
        states and free their host copies (parameter partitions on NVMe are written in the same version)."""
        if not self.nvme:
            return
        plan = nvme.sub_group_plan([b.layout.shard_numel for b in buckets], self.sub_group_size)
        self.sub_groups = groups = [[buckets[i] for i in g] for g in plan]
        numels = [sum(b.layout.shard_numel for b in g) for g in groups]
        need = 2 * 12 * sum(numels) + (param_offload.file_bytes_needed() if param_offload else 0)
        path = nvme.check_nvme_path(self.cfg.nvme_path, need * self.world_size)
        io = nvme.AsyncFileIO(self.aio.block_size, self.aio.queue_depth, self.aio.intra_op_parallelism,
                              self.aio.single_submit, self.aio.overlap_events)
        self.store = nvme.VersionedStore(path, io, prefix=f"zero_ref_rank{self.rank}_")
        self._finalizer = weakref.finalize(self, _close_store, self.store)  # swap files are scratch: removed
        self.swapper = nvme.SubGroupSwapper(self.store, numels, n_states=3, buffer_count=self.cfg.buffer_count,
                                            pipeline_read=self.cfg.pipeline_read, pipeline_write=self.cfg.pipeline_write,
                                            pin_memory=self.link.pin)
        self.store.begin()
        for i, g in enumerate(groups):
            self.swapper.write_initial(i, [torch.cat([getattr(b.partition, s) for b in g])
                                           for s in ("master", "exp_avg", "exp_avg_sq")])
        if param_offload is not None:
            param_offload.attach(self.store)
        self.store.commit()
        for b in buckets:
            part = b.partition
            part.master = part.exp_avg = part.exp_avg_sq = None  # they live in the files now

    def close(self) -> None:
        """Stop the I/O threads and delete this rank's swap files (also done when the object is collected)."""
        if self.store is not None:
            self._finalizer()

    @property
    def log(self):
        """The NVMe event log (reads, writes, steps per sub-group), or None without NVMe."""
        return self.store.log if self.store is not None else None

    # -------------------------------------------------------- backward
    def add_grad(self, part: Partition, grad: torch.Tensor) -> None:
        """Add a reduced 16-bit gradient shard (on the device) into the partition's fp32 host gradient."""
        self.link.to_host(grad, part.grad.add_)

    def grad_partitions(self, parts: list[Partition], scale: float) -> list[torch.Tensor]:
        """The fp32 host gradient partitions, multiplied by ``scale`` in place (after pending copies land)."""
        self.link.poll(wait=True)
        return [p.grad.mul_(scale) for p in parts]

    # -------------------------------------------------------- step
    def step(self, opt, grads: list[torch.Tensor]) -> None:
        """Adam on the host for every bucket of ``opt``, then the updated parameters back where they live.

        Without NVMe the parameters of bucket i are copied to the device as soon as its Adam is done.
        With NVMe the new states and parameters form one store version: the parameters are written
        only after every file of the version is complete, so a failed write raises ``SwapError`` and
        leaves parameters, states and files at the previous step; ``opt``'s own fields (its step
        counter, its gradients) are left for its ``step`` to roll back."""
        step = opt.adam_steps

        def adam(views) -> None:  # (param, grad, exp_avg, exp_avg_sq, start, end, cfg) spans: a call per group
            by_group: dict[tuple, list] = {}
            for p, g, m, v, start, end, cfg in views:
                key = (cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay)
                by_group.setdefault(key, [cfg, []])[1].append((p[start:end], g[start:end], m[start:end], v[start:end]))
            for cfg, spans in by_group.values():
                adam_update_(*map(list, zip(*spans)), step, cfg, self.cpu_adam)

        if not self.nvme:
            for b, g in zip(opt.buckets, grads):
                part = b.partition
                adam([(part.master, g, part.exp_avg, part.exp_avg_sq, *run) for run in opt.adam_runs(b)])
                opt.write_param_shard(b, part.master)
            self.link.poll()  # (CUDA: release the staging buffers of the copies that have landed)
            return
        grad_of = dict(zip(map(id, opt.buckets), grads))
        staged: list = []

        def step_group(i: int, states: list[torch.Tensor]) -> None:
            offset, views = 0, []
            for b in self.sub_groups[i]:
                n = b.layout.shard_numel
                views.append([s[offset:offset + n] for s in states])
                offset += n
            adam([(v[0], grad_of[id(b)], v[1], v[2], *run)
                  for b, v in zip(self.sub_groups[i], views) for run in opt.adam_runs(b)])
            for b, v in zip(self.sub_groups[i], views):
                staged.append((b, torch.empty(v[0].shape, dtype=b.flat_param.dtype).copy_(v[0])))

        params_in_store = opt.param_offload is not None and opt.param_offload.nvme  # one version with the states
        self.store.begin()
        try:
            self.swapper.run(step_group)
            self.store.wait_writes()
            if params_in_store:
                for b, new in staged:
                    opt.write_param_shard(b, new)  # into the open version
            self.store.commit()
        except BaseException:
            self.store.abort()
            raise
        if not params_in_store:
            for b, new in staged:
                opt.write_param_shard(b, new)

    # -------------------------------------------------------- accounting
    def host_tensors(self, buckets) -> list[torch.Tensor]:
        return [t for b in buckets for t in b.partition.optimizer_tensors() + [b.partition.grad]]

    def buffer_tensors(self) -> list[torch.Tensor]:
        return list(self.swapper.buffers) if self.swapper is not None else []


def _close_store(store) -> None:
    store.io.close()
    store.close()
