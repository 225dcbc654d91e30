"""ZeRO-Offload and ZeRO-Infinity: what moves to the host (and to NVMe), and how the step runs there.

With ``offload_optimizer={"device": "cpu"}`` (stages 1–3) each rank keeps on the **host** what
its optimizer owns — the fp32 master partition, both Adam moments and an fp32 gradient
partition — and on the **device** only the 16-bit parameters (and, in stage 1, the full 16-bit
gradient buffer it accumulates in). A step then crosses the host link twice:

    backward:  bucket reduced (reduce-scatter)  →  its 16-bit shard copied to the host, added
               into the fp32 gradient partition (``add_grad``, as each bucket completes)
    step:      norm / clipping / Adam on the host (Numba CPU Adam)  →  the updated partition,
               cast to 16 bits, copied back into the device parameters  →  all-gather (stage 1–2)

Per rank and step that is 2 · Ψ/N bytes each way in bf16 (stage 2/3 move gradients on every
micro-step; see ``pcie_bytes_per_step``). On CUDA the copies use pinned host buffers and a
side stream, so gradient copies overlap the rest of backward and the copy of bucket i's
parameters overlaps bucket i+1's Adam. On a CPU-only run the "device" is the CPU: the same
code path runs, the copies are plain CPU copies, and the bytes are counted all the same.

``offload_param={"device": "cpu"}`` (stage 3) keeps each unit's 16-bit partition on the host
between uses; it is copied to the device just before the unit's all-gather. With ``"nvme"``
(ZeRO-Infinity) the optimizer states (and the parameter partitions) live in files under
``nvme_path``, swapped in sub-groups of ``sub_group_size`` elements by ``zero_ref.offload.nvme``.

The stages call this module at five points (``adopt`` in ``_init_bucket``, ``attach`` after
the buckets exist, ``add_grad`` when a reduced gradient shard is ready, ``grad_partitions`` and
``step`` in ``ZeroOptimizerBase.step``); everything else about them is unchanged.

Simplified vs DeepSpeed (0.19.8): gradients cross the link in 16 bits and are converted on the
host (DeepSpeed's stage 1/2 converts on the GPU and copies fp32: 4 bytes per element), and
accumulate on the host in fp32 (DeepSpeed: in 16 bits, on the GPU for stages 1/2, in a host
buffer for stage 3); there is no 16-bit host copy of the partition kept between steps (DeepSpeed
keeps one, pinned, as its copy-back staging buffer); no ``ratio`` < 1 (partial offload), no
``super_offload``; ``fast_init`` is accepted and does nothing. ZeRO-Infinity keeps the fp32
gradient partition in host memory (DeepSpeed writes it to NVMe at the boundary and reads it back
in the step: 8Ψ/N more NVMe bytes per step for 4Ψ/N less host memory); ``offload_param`` on NVMe
needs ``offload_optimizer`` on NVMe too (one versioned store commits both atomically).
"""
from __future__ import annotations

import math
import weakref

import torch

from zero_ref.config import offload_sections
from zero_ref.config.schema import AioConfig, OffloadOptimizerConfig, OffloadParamConfig
from zero_ref.optim import AdamConfig, adam_step_

CPU_ADAM = ("numba", "torch")

# ---------------------------------------------------------------- configuration (DeepSpeed's keys)

def parse_configs(stage: int, offload_optimizer=None, offload_param=None, aio=None):
    """Check DeepSpeed's offload rules for ``stage``; returns (optimizer config, param config, aio config).

    The sections' keys, defaults (DeepSpeed 0.19.8's) and rules live in zero_ref.config; a problem is a
    ``zero_ref.config.ConfigError`` (a ValueError) naming the key."""
    return offload_sections(stage, offload_optimizer, offload_param, aio)


# ---------------------------------------------------------------- traffic formulas (chapters 6 and 7)

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def pcie_bytes_per_step(num_params: int, *, zero_stage: int, dp: int, precision: str = "bf16",
                        gradient_accumulation_steps: int = 1) -> dict[str, int]:
    """Bytes one rank moves over the host link per optimizer step with ``offload_optimizer`` cpu.

    Device → host: the rank's reduced 16-bit gradient shard, ⌈Ψ/N⌉ elements — once per step in
    stage 1 (it accumulates on the device), on every micro-step in stages 2 and 3. Host → device:
    the updated 16-bit partition, once per step. ``num_params`` may be a padded count."""
    if zero_stage not in (1, 2, 3):
        raise ValueError(f"offload_optimizer needs zero_stage 1, 2 or 3, got {zero_stage!r}")
    shard = math.ceil(num_params / dp) * _BYTES[precision]
    d2h = shard * (1 if zero_stage == 1 else gradient_accumulation_steps)
    return {"d2h": d2h, "h2d": shard, "total": d2h + shard}


def nvme_bytes_per_step(num_params: int, *, dp: int, precision: str = "bf16", offload_param: bool = False,
                        gathers_per_step: int = 2) -> dict[str, int]:
    """Bytes one rank reads from and writes to NVMe per optimizer step (ZeRO-Infinity, stage 3).

    The step reads and writes every sub-group's fp32 master, exp_avg and exp_avg_sq: 12 bytes per
    element of the partition each way. With parameters on NVMe too, each gather of a unit reads its
    16-bit partition (``gathers_per_step``: forward + backward = 2 per micro-step) and the step
    writes the updated partition once."""
    shard = math.ceil(num_params / dp)
    read = write = 12 * shard
    if offload_param:
        read += gathers_per_step * _BYTES[precision] * shard
        write += _BYTES[precision] * shard
    return {"read": read, "write": write}


# ---------------------------------------------------------------- the host link

class Link:
    """Copies between the device and the host, counted. On CUDA: pinned buffers and a side stream."""

    def __init__(self, device: torch.device, pin_memory: bool):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pin = bool(pin_memory) and self.cuda  # pinning needs a CUDA runtime; on CPU it means nothing
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._inflight: list = []  # (event, callback or None, host tensor kept alive) in issue order
        self.d2h_bytes = self.h2d_bytes = 0

    def host_zeros(self, n: int, dtype=torch.float32) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, pin_memory=self.pin)

    def to_host(self, src: torch.Tensor, then) -> None:
        """Copy device tensor ``src`` to the host and call ``then(host_copy)`` once it has arrived."""
        self.d2h_bytes += src.numel() * src.element_size()
        if not self.cuda:
            then(src)
            return
        buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # src is complete on the compute stream
        with torch.cuda.stream(self.stream):
            buf.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        src.record_stream(self.stream)  # the allocator must not reuse src before the copy has read it
        self._inflight.append((done, then, buf))
        self.poll()

    def to_device(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy host tensor ``src`` into device tensor ``dst``, cast to ``dst``'s dtype on the host first."""
        self.h2d_bytes += dst.numel() * dst.element_size()
        if not self.cuda:
            dst.copy_(src)
            return
        stage = torch.empty(dst.shape, dtype=dst.dtype, pin_memory=True)
        stage.copy_(src)  # cast on the host: 16-bit values cross the link
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)  # earlier readers of dst (an all-gather) are done
        with torch.cuda.stream(self.stream):
            dst.copy_(stage, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        compute.wait_event(done)  # later kernels and collectives see the new values
        self._inflight.append((done, None, stage))

    def poll(self, wait: bool = False) -> None:
        """Finish the copies that have arrived (all of them with ``wait``), in issue order."""
        while self._inflight:
            done, then, buf = self._inflight[0]
            if not wait and not done.query():
                return
            done.synchronize()
            self._inflight.pop(0)
            if then is not None:
                then(buf)


# ---------------------------------------------------------------- optimizer offload

def _cpu_adam(params, grads, exp_avgs, exp_avg_sqs, step: int, cfg: AdamConfig, backend: str) -> None:
    """One Adam(W) step on host tensors: the fused Numba kernel, or torch's ops (bit for bit the
    non-offloaded step on a CPU run; the Numba kernel's IEEE sqrt differs from torch's in the last bit)."""
    if backend == "torch":
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            adam_step_(p, g, m, v, step, cfg)
        return
    import numba

    from zero_ref.kernels import adam_step
    threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))  # the rank's share of the cores
    try:
        adam_step(params, grads, exp_avgs, exp_avg_sqs, step, cfg, backend="numba")
    finally:
        # Numba's OpenMP layer sets the process's OpenMP thread count, which is torch's too: restore it, or
        # later torch reductions silently run on more threads (and add in another order).
        torch.set_num_threads(threads)


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
    def adopt(self, b) -> None:
        """Give bucket ``b`` a host fp32 master (a copy of ``b.master``), Adam moments and gradient partition."""
        n = b.layout.shard_numel
        master = self.link.host_zeros(n)
        master.copy_(b.master)
        b.master = master
        b.exp_avg, b.exp_avg_sq, b.grad_shard = (self.link.host_zeros(n) for _ in range(3))

    def attach(self, opt, buckets, param_offload=None) -> None:
        """After every bucket is adopted. NVMe: form sub-groups, check ``nvme_path``, write version 1 of the
        states and free their host copies (parameter partitions on NVMe are written in the same version)."""
        if not self.nvme:
            return
        from zero_ref.offload import nvme
        plan = nvme.sub_group_plan([b.layout.shard_numel for b in buckets], self.sub_group_size)
        self.sub_groups = groups = [[buckets[i] for i in g] for g in plan]
        numels = [sum(b.layout.shard_numel for b in g) for g in groups]
        need = 2 * 12 * sum(numels) + (param_offload.file_bytes_needed(opt) if param_offload else 0)
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
            self.swapper.write_initial(i, [torch.cat([getattr(b, s) for b in g]) for s in ("master", "exp_avg", "exp_avg_sq")])
        if param_offload is not None:
            param_offload.attach(opt, self.store)
        self.store.commit()
        for b in buckets:
            b.master = b.exp_avg = b.exp_avg_sq = None  # they live in the files now

    def close(self) -> None:
        """Stop the I/O threads and delete this rank's swap files (also done when the object is collected)."""
        if self.store is not None:
            self._finalizer()

    @property
    def log(self):
        """The NVMe event log (reads, writes, steps per sub-group), or None without NVMe."""
        return self.store.log if self.store is not None else None

    # -------------------------------------------------------- backward
    def add_grad(self, b, grad: torch.Tensor) -> None:
        """Add a reduced 16-bit gradient shard (on the device) into ``b``'s fp32 host partition."""
        self.link.to_host(grad, b.grad_shard.add_)

    def grad_partitions(self, buckets, scale: float) -> list[torch.Tensor]:
        """The fp32 host gradient partitions, multiplied by ``scale`` in place (after pending copies land)."""
        self.link.poll(wait=True)
        return [b.grad_shard.mul_(scale) for b in buckets]

    def zero_grads(self, buckets) -> None:
        for b in buckets:
            b.grad_shard.zero_()

    # -------------------------------------------------------- step
    def step(self, opt, grads: list[torch.Tensor]) -> None:
        """Adam on the host for every bucket of ``opt``, then the updated parameters back where they live.

        Without NVMe the parameters of bucket i are copied to the device as soon as its Adam is done.
        With NVMe the new states and parameters form one store version: the parameters are written
        only after every file of the version is complete, so a failed write raises ``SwapError`` and
        leaves parameters, states and files at the previous step (``opt.global_steps`` rolled back, this
        step's gradients dropped)."""
        step = opt.global_steps

        def adam(views) -> None:  # (param, grad, exp_avg, exp_avg_sq, start, end, cfg) spans: a call per group
            by_group: dict[tuple, list] = {}
            for p, g, m, v, start, end, cfg in views:
                key = (cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay)
                by_group.setdefault(key, [cfg, []])[1].append((p[start:end], g[start:end], m[start:end], v[start:end]))
            for cfg, spans in by_group.values():
                _cpu_adam(*map(list, zip(*spans)), step, cfg, self.cpu_adam)

        if not self.nvme:
            for b, g in zip(opt.buckets, grads):
                adam([(b.master, g, b.exp_avg, b.exp_avg_sq, *run) for run in opt.adam_runs(b)])
                self._write_params(b, b.master)
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
                staged.append((b, torch.empty(v[0].shape, dtype=_param_dtype(b)).copy_(v[0])))

        self.store.begin()
        try:
            self.swapper.run(step_group)
            self.store.wait_writes()
            for b, new in staged:
                if getattr(b, "offload", None) is not None and b.offload.nvme:
                    b.offload.write_part(b, new)  # into the open version
            self.store.commit()
        except BaseException:
            self.store.abort()
            opt.global_steps -= 1
            opt._zero_grads()  # the step is dropped: training can go on from the previous state
            raise
        for b, new in staged:
            if getattr(b, "offload", None) is None or not b.offload.nvme:
                self._write_params(b, new)

    def _write_params(self, b, values: torch.Tensor) -> None:
        """Updated values (host, fp32 or 16-bit) into the bucket's parameter shard, wherever it lives."""
        if getattr(b, "offload", None) is not None:  # a ZeRO-3 unit whose partition lives on the host / NVMe
            b.offload.write_part(b, values)
        else:
            self.link.to_device(b.part if hasattr(b, "part") else b.shard(b.flat_param), values)

    # -------------------------------------------------------- accounting
    def host_tensors(self, buckets) -> list[torch.Tensor]:
        return [t for b in buckets for t in (b.master, b.exp_avg, b.exp_avg_sq, b.grad_shard) if t is not None]

    def buffer_tensors(self) -> list[torch.Tensor]:
        return list(self.swapper.buffers) if self.swapper is not None else []


def _param_dtype(b) -> torch.dtype:
    return b.part.dtype if hasattr(b, "part") else b.flat_param.dtype


def _close_store(store) -> None:
    store.io.close()
    store.close()


# ---------------------------------------------------------------- parameter offload (ZeRO-3)

class ParamOffload:
    """ZeRO-3 units' 16-bit partitions on the host (``"cpu"``) or in NVMe files (``"nvme"``) between uses.

    A unit with ``unit.offload = self`` asks ``fetch`` for its partition on the device before an
    all-gather, and hands updated values to ``write_part``."""

    def __init__(self, cfg: OffloadParamConfig, link: Link):
        self.cfg, self.link, self.nvme = cfg, link, cfg.device == "nvme"
        self.store = None

    @staticmethod
    def key(u) -> str:
        return f"param{u.index}"

    def adopt(self, u) -> None:
        """Move unit ``u``'s partition to the host (cpu) — or mark it for the store (nvme, in ``attach``)."""
        if self.nvme and u.layout.shard_numel > self.cfg.buffer_size:
            raise ValueError(f"zero_optimization.offload_param.buffer_size={self.cfg.buffer_size} is smaller than "
                             f"the partition of '{u.name}' ({u.layout.shard_numel} elements)")
        host = self.link.host_zeros(u.layout.shard_numel, u.part.dtype)
        host.copy_(u.part)
        u.part, u.offload = host, self

    def file_bytes_needed(self, opt) -> int:
        return 2 * sum(u.part.numel() * u.part.element_size() for u in opt.units if u.offload is self)

    def attach(self, opt, store) -> None:
        """NVMe: write every adopted unit's partition into ``store``'s open version; keep none in memory."""
        self.store = store
        for u in opt.units:
            if u.offload is self and self.nvme:
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

    def host_tensors(self, units) -> list[torch.Tensor]:
        return [u.part for u in units if u.offload is self and u.part.numel()]


# ---------------------------------------------------------------- building and measuring

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
    from zero_ref.measure import storage_key, unique_storage_bytes
    host = []
    if opt.offload is not None:
        host += opt.offload.host_tensors(opt.buckets)
    if getattr(opt, "param_offload", None) is not None:
        host += opt.param_offload.host_tensors(opt.units)
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
