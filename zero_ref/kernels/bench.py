"""Measure Adam steps and the memory bandwidth they are bound by, in one interleaved run.

Used by ``benchmarks/adam_kernels.py`` (the full table) and chapter 14 (a small one). Every
candidate is a zero-argument callable that does one optimizer step on its tensors; candidates
of one configuration are timed round-robin (``time_interleaved``) so that a noisy, bimodal
machine disturbs all of them alike, and medians are reported. Each turn is a short burst of
steps: the first finds the caches as the other candidates left them (cold), the next ones find
the candidate's own data in cache if it fits (warm: at 1M parameters the 16 MB of fp32 state
fits this machine's 32 MB L3; at 16M it does not, and warm = cold).

On the CPU the ceiling is measured, not looked up: ``numba_cpu.stream_adam_pattern`` makes
exactly Adam's accesses (read p, g, m, v; write p, m, v) with one add per store, on flat fp32
arrays of the same total size, in the same run. On a GPU the ceiling is a device-to-device copy
of a 1 GiB buffer (``torch.Tensor.copy_``: 1 read + 1 write per element).
"""
from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from zero_ref.kernels.adam import AdamTensors, adam_step
from zero_ref.optim import AdamConfig

STREAM = "stream (4 reads + 3 writes)"
CPU_METHODS = ("numba", "numba adam_step()", "torch for-loop", "torch foreach", "torch fused", "deepspeed")
GPU_METHODS = ("cuda ext", "numba cuda", "torch foreach", "torch fused")


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
                     sync: Callable[[], object] | None = None, burst: int = 1,
                     seed: int = 0) -> dict[str, list[list[float]]]:
    """Seconds per call, interleaved: each round calls every function ``burst`` times in a row,
    in a fresh random order (seeded), so each function follows each other one equally often —
    a fixed or rotating order would always put the same predecessor, and its cache footprint,
    before a given function. Returns, per function, one list of ``burst`` times per round: the
    first call of a burst finds the caches as the other functions left them ("cold"), the
    following ones find its own data where it left it ("warm")."""
    names = list(fns)
    order = random.Random(seed)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    if sync:
        sync()
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(repeats):
        for name in order.sample(names, len(names)):
            burst_times = []
            for _ in range(burst):
                t0 = time.perf_counter()
                fns[name]()
                if sync:
                    sync()
                burst_times.append(time.perf_counter() - t0)
            times[name].append(burst_times)
    return times


@dataclass
class Result:
    """One method on one configuration: medians over interleaved repetitions."""

    method: str
    n_params: int
    n_tensors: int
    seconds: list[float]        # warm calls (all calls when bursts are of 1)
    cold_seconds: list[float]   # the first call of each burst
    bytes_per_param: int = 28

    @classmethod
    def from_bursts(cls, method: str, n_params: int, n_tensors: int, bursts: list[list[float]]) -> "Result":
        cold = [b[0] for b in bursts]
        warm = [t for b in bursts for t in b[1:]] or cold
        return cls(method, n_params, n_tensors, warm, cold)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cold_median_s(self) -> float:
        return statistics.median(self.cold_seconds)

    @property
    def gparams_per_s(self) -> float:
        return self.n_params / self.median_s / 1e9

    @property
    def gbs(self) -> float:
        """Effective bandwidth: the bytes a fused step must move, over the time it took."""
        return self.n_params * self.bytes_per_param / self.median_s / 1e9


def _layout(n_params: int, n_tensors: int) -> list[int]:
    base, extra = divmod(n_params, n_tensors)
    return [base + (i < extra) for i in range(n_tensors)]


def _deepspeed_adam(params, cfg: AdamConfig):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                            adamw_mode=cfg.adamw, fp32_optimizer_states=True)


def cpu_candidates(n_params: int, n_tensors: int = 1, methods=CPU_METHODS, stream: bool = True,
                   seed: int = 0) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """One-step callables for ``methods`` on ``n_params`` fp32 parameters in ``n_tensors`` tensors.

    All methods step the same parameters and gradients, each with its own moments. Returns the
    callables and, for methods that cannot run here, the reason.
    """
    gen = torch.Generator().manual_seed(seed)
    sizes = _layout(n_params, n_tensors)
    params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    cfg = AdamConfig()
    fns: dict[str, Callable[[], object]] = {}
    skipped: dict[str, str] = {}
    data, grads = [p.data for p in params], [p.grad for p in params]
    for method in methods:
        if method == "numba":
            tensors = AdamTensors(data, grads, [torch.zeros(n) for n in sizes], [torch.zeros(n) for n in sizes])
            fns[method] = lambda t=tensors: t.step(1, cfg, backend="numba")
        elif method == "numba adam_step()":
            ms, vs = [torch.zeros(n) for n in sizes], [torch.zeros(n) for n in sizes]
            fns[method] = lambda ms=ms, vs=vs: adam_step(data, grads, ms, vs, 1, cfg, backend="numba")
        elif method in ("torch for-loop", "torch foreach", "torch fused"):
            kind = {"torch for-loop": {"foreach": False}, "torch foreach": {"foreach": True},
                    "torch fused": {"fused": True}}[method]
            opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                                    **kind)
            fns[method] = opt.step
        elif method == "deepspeed":
            try:
                fns[method] = _deepspeed_adam(params, cfg).step
            except Exception as e:  # noqa: BLE001 - a missing or unbuildable peer is reported, not fatal
                skipped[method] = f"DeepSpeedCPUAdam unavailable: {type(e).__name__}: {e}"
        else:
            raise ValueError(f"unknown CPU method {method!r}; choose from {', '.join(CPU_METHODS)}")
    if stream:
        from zero_ref.kernels import numba_cpu

        arrays = [torch.zeros(n_params).numpy() for _ in range(4)]
        fns[STREAM] = lambda: numba_cpu.stream_adam_pattern(*arrays)
    return fns, skipped


def measure_cpu(n_params: int, n_tensors: int = 1, methods=CPU_METHODS, repeats: int = 11, burst: int = 3,
                threads: int | None = None) -> tuple[list[Result], dict[str, str]]:
    """Time ``methods`` and the streaming ceiling on one configuration (interleaved medians;
    ``Result.seconds`` are the warm calls of each burst, ``cold_seconds`` the first ones)."""
    if threads:
        import numba

        torch.set_num_threads(threads)
        numba.set_num_threads(threads)
    fns, skipped = cpu_candidates(n_params, n_tensors, methods)
    times = time_interleaved(fns, repeats, burst=burst)
    return [Result.from_bursts(m, n_params, n_tensors, ts) for m, ts in times.items()], skipped


def gpu_candidates(n_params: int, n_tensors: int = 1, methods=GPU_METHODS, seed: int = 0):
    """One-step callables on CUDA tensors, and the reasons for methods that cannot run."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    sizes = _layout(n_params, n_tensors)
    params = [torch.nn.Parameter(torch.randn(n, generator=gen, device=dev)) for n in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, device=dev) * 1e-2
    cfg = AdamConfig()
    fns, skipped = {}, {}
    data, grads = [p.data for p in params], [p.grad for p in params]
    for method in methods:
        if method in ("cuda ext", "numba cuda"):
            backend = {"cuda ext": "cuda", "numba cuda": "numba_cuda"}[method]
            tensors = AdamTensors(data, grads, [torch.zeros_like(p) for p in data], [torch.zeros_like(p) for p in data])
            try:
                tensors.step(1, cfg, backend=backend)
                fns[method] = lambda t=tensors, b=backend: t.step(1, cfg, backend=b)
            except Exception as e:  # noqa: BLE001
                skipped[method] = f"{type(e).__name__}: {e}"
        elif method in ("torch foreach", "torch fused"):
            kind = {"foreach": True} if method == "torch foreach" else {"fused": True}
            opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                                    **kind)
            fns[method] = opt.step
        else:
            raise ValueError(f"unknown GPU method {method!r}; choose from {', '.join(GPU_METHODS)}")
    return fns, skipped


def gpu_copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (read + write bytes over time, median)."""
    src = torch.empty(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    times = time_interleaved({"copy": lambda: dst.copy_(src)}, repeats, warmup=3, sync=torch.cuda.synchronize)
    return 2 * nbytes / statistics.median(t for (t,) in times["copy"]) / 1e9


def measure_gpu(n_params: int, n_tensors: int = 1, methods=GPU_METHODS, repeats: int = 20):
    fns, skipped = gpu_candidates(n_params, n_tensors, methods)
    times = time_interleaved(fns, repeats, warmup=3, sync=torch.cuda.synchronize)
    return [Result.from_bursts(m, n_params, n_tensors, ts) for m, ts in times.items()], skipped


def cpu_matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    """The CPU's compute roof, measured: fp32 ``torch.mm`` of two n × n matrices, 2n³ flops."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    times = time_interleaved({"mm": lambda: torch.mm(a, b)}, repeats, warmup=2)
    return 2 * n**3 / statistics.median(t for (t,) in times["mm"]) / 1e9
