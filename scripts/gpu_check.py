"""One prepared check of zero_ref on a GPU machine: kernels, ZeRO stages, offload and activations, measured.

    python3 scripts/gpu_check.py --out DIR [--dry-run] [--quick] [--parts ext,stages,...] [--time-limit 470]
                                 [--fail-part PART]

Writes ``DIR/results.json`` (every measurement, the machine's facts, each part's plan) and
``DIR/results.md`` (the same as tables, under the machine, the date, torch's and CUDA's versions and
the command), rewritten after every part so that a run cut short still leaves what it measured.
``make gpu-check OUT=benchmarks/gpu`` stores a run where chapter 14 shows it (``zero_ref.kernels.gpu_results``).
Parts (each independent: one that raises has its traceback recorded
and the others still run; each has a time budget it checks between measurements):

===================  =======================================================================
``ext``              the fused Adam CUDA extension JIT-built for this GPU's architecture
                     (``zero_ref.kernels.cuda_ext.load``: ninja, nvcc ``-gencode`` for the
                     device's compute capability), against ``torch.optim.AdamW`` / ``Adam``
``adam_throughput``  Adam steps of the extension, numba.cuda and torch's fused / foreach AdamW,
                     16M–1024M parameters (M = 2**20) in 1 and 100 tensors, as GB/s (28 bytes
                     per fp32 parameter) against a device-to-device copy timed in the same run
``stages``           ZeRO stages 0–3 on NCCL (1 rank in this process, then every GPU if more than one)
                     against single-process AdamW, and their memory against ``zero_ref.memory``
``offload``          ZeRO-Offload's bytes over the host link against ``pcie_bytes_per_step``,
                     and its copy times against the simulator's link model (``sim.cost``)
``activations``      bytes autograd saves in a GPT block (explicit attention, and
                     ``scaled_dot_product_attention``'s flash kernel) against Korthikanti et al.
===================  =======================================================================

By default the parts run cheapest first (``RUN_ORDER``). Exit status: 0 when every part ran or was
skipped and every check held, 1 when a part raised or a check did not hold, 3 at the time limit.

``--dry-run`` is a structure check for a machine without a GPU: every part computes and records
its plan, runs tiny sizes on the CPU where the code path allows (numba.cuda in Numba's CUDA
simulator, the stages on gloo, activations with the math attention) and marks the rest skipped.
No number of a dry run is a GPU measurement. ``--quick`` runs fewer sizes (``QUICK_*``: Adam at 16M
and 256M, one link size, one activation shape, two extension checks). ``--fail-part PART`` makes that
part raise right after recording its plan, to show on any machine that the other parts still run.

Only torch, numpy, numba, the standard library and this repository are imported: the GPU machine
has nothing else (no cloudpickle, so no ``zero_ref.launch``; ranks are spawned here).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import platform
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

GiB = 1 << 30
DRY_RUN_NOTE = ("DRY RUN: a structure check on the CPU with tiny sizes (numba.cuda in Numba's CUDA simulator, "
                "gloo instead of NCCL); no number in it is a GPU measurement.")


class Skip(Exception):
    """A part (or the rest of it) cannot run here; the reason is recorded, not a traceback."""


# ---------------------------------------------------------------- recording

class Part:
    """What one part records: its plan, tables, checks (must hold) and notes; it prints as it goes."""

    def __init__(self, name: str, budget_s: float, device: str | None, dry_run: bool, record: dict,
                 quick: bool = False, fail: bool = False):
        self.name, self.budget_s, self.device, self.dry_run = name, budget_s, device, dry_run
        self.quick, self.fail = quick, fail
        self.rec = record
        self.rec.update(status="running", budget_s=budget_s, plan={}, tables=[], checks=[], notes=[])
        self.t0 = time.perf_counter()

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def log(self, msg: str) -> None:
        print(f"[{self.name} {time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)

    def pick(self, full, quick, dry):
        """The sizes this run uses: tiny on the CPU of a dry run, fewer with --quick, else the full set."""
        if self.dry_run and not self.cuda:
            return dry
        return quick if self.quick else full

    def plan(self, **items) -> None:
        self.rec["plan"].update(items)
        for k, v in items.items():
            self.log(f"plan {k}: {v}")
        if self.fail:  # --fail-part: raise where a real failure would, after the part has recorded its plan
            raise RuntimeError(f"injected failure in part {self.name} (--fail-part)")

    def note(self, msg: str) -> None:
        self.rec["notes"].append(msg)
        self.log(msg)

    def table(self, title: str, columns: list[str]) -> list:
        rows: list = []
        self.rec["tables"].append({"title": title, "columns": columns, "rows": rows})
        return rows

    def row(self, rows: list, *values) -> None:
        rows.append(list(values))
        self.log(" | ".join(_fmt(v) for v in values))

    def check(self, what: str, ok: bool, measured, expected, tolerance: str) -> bool:
        self.rec["checks"].append({"check": what, "ok": bool(ok), "measured": measured, "expected": expected,
                                   "tolerance": tolerance})
        self.log(f"{'PASS' if ok else 'FAIL'} {what}: {_fmt(measured)} vs {_fmt(expected)} ({tolerance})")
        return bool(ok)

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def within_budget(self, what: str, needs_s: float = 0.0) -> bool:
        """False (and a note) when ``what`` would start after the part's time budget is spent."""
        if self.left_s() > needs_s:
            return True
        self.note(f"skipped {what}: the part's {self.budget_s:.0f} s budget is spent")
        return False

    def need_cuda(self, what: str | None = None) -> None:
        if not self.cuda:
            why = "dry run (CPU only)" if self.dry_run and torch.cuda.is_available() else "no CUDA"
            raise Skip(f"{what}: {why}" if what else why)


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v.is_integer() and abs(v) < 1e15:  # byte counts from the formulas arrive as floats
            return f"{int(v):,}"
        return f"{v:.4g}" if (v == 0 or 1e-3 <= abs(v) < 1e6) else f"{v:.3e}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # strict JSON has no inf / nan
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


RESULTS_JSON, RESULTS_MD = "results.json", "results.md"


def write_report(out_dir: Path, report: dict) -> None:
    """results.json and results.md, each written whole to a temporary name and renamed."""
    data = json.dumps(_jsonable(report), indent=1, allow_nan=False)
    for name, text in ((RESULTS_JSON, data), (RESULTS_MD, markdown(report))):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out_dir / name)


def _md_table(columns, rows) -> list[str]:
    esc = lambda v: _fmt(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + \
           ["| " + " | ".join(esc(v) for v in r) + " |" for r in rows]


def markdown(report: dict) -> str:
    from zero_ref.kernels.gpu_results import header

    lines = [f"# GPU check, {report['started']}", ""]
    if report["dry_run"]:
        lines += [f"> **{DRY_RUN_NOTE}**", ""]
    lines += header(report) + [""]
    summary = [[name, p.get("status"), round(p.get("seconds", 0.0), 1),
                f"{sum(c['ok'] for c in p.get('checks', []))}/{len(p.get('checks', []))}"]
               for name, p in report["parts"].items()]
    lines += _md_table(["part", "status", "seconds", "checks passed"], summary) + [""]
    for name, p in report["parts"].items():
        lines += [f"## {name}: {p.get('status')}", ""]
        for k, v in p.get("plan", {}).items():
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                lines += [f"- **{k}**:", ""] + _md_table(list(v[0]), [list(x.values()) for x in v]) + [""]
            else:
                lines.append(f"- **{k}**: {_fmt(v)}")
        lines += [""] if p.get("plan") else []
        for t in p.get("tables", []):
            lines += [f"**{t['title']}**", ""] + _md_table(t["columns"], t["rows"]) + [""]
        if p.get("checks"):
            rows = [[c["check"], "PASS" if c["ok"] else "FAIL", c["measured"], c["expected"], c["tolerance"]]
                    for c in p["checks"]]
            lines += _md_table(["check", "result", "measured", "expected", "tolerance"], rows) + [""]
        lines += [f"- {n}" for n in p.get("notes", [])] + ([""] if p.get("notes") else [])
        if p.get("traceback"):
            lines += ["```", p["traceback"].rstrip(), "```", ""]
    lines.append(f"Finished {report.get('finished', '(not finished)')}, {report.get('wall_s', 0):.0f} s.")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- machine facts

def git_commit(root: Path = ROOT) -> str | None:
    """HEAD's commit read from .git without the git binary (None when there is no .git)."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree: .git names its own folder, which names the shared one (refs)
            git = (root / git.read_text().split("gitdir:", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / "commondir").exists():
            git = (git / (git / "commondir").read_text().strip()).resolve()
        if (git / ref).exists():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return None


def source_digest(root: Path = ROOT) -> str:
    """sha256 over the sources this check runs (zero_ref, sim, the CUDA sources, this script)."""
    h = hashlib.sha256()
    files = sorted([*root.glob("zero_ref/**/*.py"), *root.glob("zero_ref/kernels/csrc/*"), *root.glob("sim/*.py"),
                    Path(__file__).resolve()])
    for f in files:
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def machine_facts() -> dict:
    facts = {"python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
             "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
             "git_commit": git_commit(), "source_digest": source_digest()}
    try:
        import numba
        facts["numba"] = numba.__version__
    except ImportError as e:
        facts["numba"] = f"not importable: {e}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                     capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                     gpu_memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count,
                     cudnn=torch.backends.cudnn.version(), nccl=str(torch.cuda.nccl.version()))
    return facts


# ---------------------------------------------------------------- shared helpers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def process_group(backend: str, world: int = 1, rank: int = 0, port: int | None = None):
    """A torch.distributed default group over TCP on this host (no launcher needed), destroyed on exit."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port or free_port()}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    try:
        yield
    finally:
        dist.destroy_process_group()


def release_memory() -> None:
    """Free what the last measurement left on the GPU: stages and their modules hold each other through
    hooks, so their tensors go only with a collection. (On the CPU there is nothing to measure it for, and
    with torch's thousands of objects a collection costs ~0.3 s.)"""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def time_cuda(fns: dict, repeats: int, warmup: int = 3, seed: int = 0) -> dict[str, list[float]]:
    """Seconds per call from CUDA events, interleaved in a fresh random order each round (as
    ``bench.time_interleaved`` does on the CPU, so a slow phase of the machine hits every method)."""
    names, order = list(fns), random.Random(seed)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    torch.cuda.synchronize()
    events: dict[str, list] = {name: [] for name in names}
    for _ in range(repeats):
        for name in order.sample(names, len(names)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: [s.elapsed_time(e) / 1e3 for s, e in ev] for name, ev in events.items()}


def time_cpu(fns: dict, repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    from zero_ref.kernels import bench

    return {name: [t for (t,) in bursts] for name, bursts in bench.time_interleaved(fns, repeats, warmup).items()}


def adam_step_bytes(n_params: int) -> int:
    """Bytes one fused fp32 Adam step must move: read p, g, m, v and write p, m, v = 28 per parameter."""
    from zero_ref.kernels import roofline

    return n_params * roofline.adam_bytes_per_param("fp32")


# ---------------------------------------------------------------- 1. ext

EXT_SIZES = [[1, 7, 33, 1000], [(1 << 20) + 5], [16 << 20], [2] * 130 + [3 * 8192 + 5]]
QUICK_EXT_SIZES = [EXT_SIZES[0], EXT_SIZES[3]]  # odd sizes (the scalar tail) and the multi-tensor table
EXT_STEPS = 10
# The kernels form the denominator as fma(sqrt(v), 1/sqrt(bc2), eps), one division where torch has two:
# the parameters differ from torch's in the last bits (tests/zero_ref/test_kernels.py's bound). The moments follow
# torch's CPU operations bit for bit; torch's CUDA kernels may round them differently, so here they are
# held to the same relative bound and their bit-equality is recorded, against both of torch's CUDA paths.
EXT_REL_TOL = 1e-6


def set_arch_list() -> str:
    """Build for this GPU's compute capability only (nvcc -gencode arch=compute_XY,code=sm_XY), and the same
    in every part: a different TORCH_CUDA_ARCH_LIST makes cpp_extension.load rebuild the extension."""
    major, minor = torch.cuda.get_device_capability(0)
    return os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")


def part_ext(p: Part) -> None:
    from zero_ref.kernels import cuda_ext
    from zero_ref.kernels.check import compare_with_torch

    ext_sizes = p.pick(EXT_SIZES, QUICK_EXT_SIZES, EXT_SIZES)
    p.plan(build="zero_ref.kernels.cuda_ext.load(): torch.utils.cpp_extension.load with ninja, "
                 "TORCH_CUDA_ARCH_LIST = the device's capability (nvcc -gencode arch=compute_XY,code=sm_XY; "
                 "sm_90 on an H100/H200)",
           cuda_cflags=" ".join(cuda_ext.CUDA_CFLAGS),
           sizes=["+".join(map(str, s)) if len(s) < 8 else f"{len(s)} tensors ({sum(s):,} elements)"
                  for s in ext_sizes],
           steps=EXT_STEPS, compare="torch.optim.AdamW (decoupled decay) and torch.optim.Adam (L2), same inputs",
           tolerance=f"max|x - x_ref| / max|x_ref| <= {EXT_REL_TOL:g} for the parameters and both moments; "
                     "bit-equality recorded")
    p.need_cuda("the CUDA extension")
    from torch.utils import cpp_extension

    arch_list = set_arch_list()
    nvcc = Path(cpp_extension.CUDA_HOME or "/usr/local/cuda") / "bin" / "nvcc"
    try:
        nvcc_version = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30).stdout
        nvcc_version = nvcc_version.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError) as e:
        nvcc_version = f"not runnable: {e}"
    try:
        arch_flags = " ".join(cpp_extension._get_cuda_arch_flags())
    except Exception as e:  # noqa: BLE001 - a private helper; its absence is only a missing detail
        arch_flags = f"unknown ({type(e).__name__})"
    p.plan(arch_list=arch_list, arch_flags=arch_flags, nvcc=f"{nvcc}: {nvcc_version}",
           ninja=cpp_extension.is_ninja_available(), build_directory=str(cuda_ext.build_directory()))
    t0 = time.perf_counter()
    module = cuda_ext.load(verbose=True)
    p.rec["build_s"] = time.perf_counter() - t0
    p.note(f"built and imported in {p.rec['build_s']:.1f} s; exports "
           f"{', '.join(n for n in dir(module) if not n.startswith('_'))}")
    rows = p.table("cuda extension against torch.optim", ["tensors", "elements", "optimizer", "torch path",
                                                          "params max rel error", "moments max rel error",
                                                          "exp_avg bit-equal", "exp_avg_sq bit-equal",
                                                          "params bit-equal"])
    for sizes in ext_sizes:
        for adamw in (True, False):
            for foreach in (True, False):
                if not p.within_budget(f"sizes {sizes[:3]}... {'AdamW' if adamw else 'Adam'}"):
                    return
                r = compare_with_torch("cuda", sizes, EXT_STEPS, adamw=adamw, device="cuda", foreach=foreach)
                opt, path = ("AdamW" if adamw else "Adam (L2)"), ("foreach" if foreach else "single-tensor")
                p.row(rows, len(sizes), sum(sizes), opt, path, r["max_rel_error"], r["moments_rel_error"],
                      r["exp_avg_equal"], r["exp_avg_sq_equal"], r["params_equal"])
                worst = max(r["max_rel_error"], r["moments_rel_error"])
                p.check(f"cuda ext = torch {opt} ({path}), {len(sizes)} tensors, {sum(sizes):,} elements",
                        worst <= EXT_REL_TOL, worst, 0.0, f"params and moments rel <= {EXT_REL_TOL:g}")


# ---------------------------------------------------------------- 2. adam_throughput

THROUGHPUT_SIZES = [16 << 20, 64 << 20, 256 << 20, 1 << 30]
QUICK_THROUGHPUT_SIZES = [16 << 20, 256 << 20]
THROUGHPUT_TENSORS = [1, 100]
REPEATS, WARMUP = 10, 3
COPY_BYTES = 2 * GiB
DRY_SIZES, DRY_TENSORS, DRY_REPEATS = [256], [1, 2], 3
# numba.cuda against torch: sizes 1, 7 and a few hundred; the simulator runs each thread in Python, so smaller there
CHECK_SIZES, DRY_CHECK_SIZES = (1, 7, 1000), (1, 7, 300)
# Per parameter: p and g (4 + 4) shared by all methods, plus each method's own exp_avg and exp_avg_sq
# (8 × 4 methods), plus up to 8 of temporaries in torch's foreach step (sqrt(v) and the update).
BYTES_PER_PARAM_HELD = 4 + 4 + 8 * 4 + 8


def label(n: int) -> str:
    """16M, 1024M: M = 2**20 parameters, as benchmarks/adam_kernels.py labels them."""
    return f"{n >> 20}M" if n % (1 << 20) == 0 else f"{n:,}"


def copy_roofline(p: Part, device: str, nbytes: int) -> float:
    """Device-to-device (dry run: host) copy bandwidth, read + write bytes over the median time."""
    src = torch.empty(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    fns = {"copy": lambda: dst.copy_(src)}
    times = (time_cuda(fns, REPEATS) if device == "cuda" else time_cpu(fns, DRY_REPEATS))["copy"]
    gbs = 2 * nbytes / statistics.median(times) / 1e9
    p.note(f"{device} copy of {nbytes / GiB:g} GiB: {gbs:.1f} GB/s (2 × {nbytes:,} bytes over the median of "
           f"{len(times)} CUDA-event times)" if device == "cuda" else
           f"host copy of {nbytes:,} bytes: {gbs:.2f} GB/s (dry run: perf_counter)")
    return gbs


def _dry_candidates(n: int, t: int):
    """CPU stand-ins: torch's foreach / fused AdamW and the numba.cuda kernel in the simulator."""
    from zero_ref.kernels import AdamTensors, bench
    from zero_ref.optim import AdamConfig

    fns, skipped = bench.cpu_candidates(n, t, methods=("torch foreach", "torch fused"), stream=False)
    sizes = bench._layout(n, t)
    gen = torch.Generator().manual_seed(1)
    tensors = AdamTensors(*([torch.randn(k, generator=gen) for k in sizes] for _ in range(2)),
                          [torch.zeros(k) for k in sizes], [torch.zeros(k) for k in sizes])
    fns["numba cuda"] = lambda: tensors.step(1, AdamConfig(), backend="numba_cuda")
    return fns, skipped


def part_adam_throughput(p: Part) -> None:
    from zero_ref.kernels import bench, cuda_ext, numba_cuda
    from zero_ref.kernels.check import compare_with_torch

    free = torch.cuda.mem_get_info()[0] if p.cuda else None
    # the plan is the GPU's even in a dry run (which then runs DRY_SIZES): it shows what the machine will do
    gpu_sizes = QUICK_THROUGHPUT_SIZES if p.quick else THROUGHPUT_SIZES
    plan = [{"params": label(n), "tensors": t, "bytes_per_step": adam_step_bytes(n),
             "memory_needed_GB": round(n * BYTES_PER_PARAM_HELD / 1e9, 1),
             "fits": None if free is None else n * BYTES_PER_PARAM_HELD * 1.1 < free}
            for n in gpu_sizes for t in THROUGHPUT_TENSORS]
    p.plan(methods=list(bench.GPU_METHODS), configs=plan, repeats=REPEATS, warmup=WARMUP,
           bytes_counted="28 bytes per fp32 parameter and step: read p, g, m, v (16) + write p, m, v (12), "
                         "for every method (effective GB/s: torch foreach's op-by-op step moves more, ~84)",
           timing="CUDA events around each step, methods interleaved in a random order per round, median",
           roofline=f"device-to-device copy of {COPY_BYTES / GiB:g} GiB (1 read + 1 write per byte), same run",
           correctness=f"numba.cuda against torch AdamW and Adam, {EXT_STEPS} steps, sizes {CHECK_SIZES} "
                       f"(dry run {DRY_CHECK_SIZES}): rel <= {EXT_REL_TOL:g}")
    if not p.cuda and not p.dry_run:
        p.need_cuda()
    device = "cuda" if p.cuda else "cpu"
    if not p.cuda:
        p.note("dry run: the numba.cuda kernel in Numba's CUDA simulator and torch's AdamW on the CPU, "
               f"{DRY_SIZES} parameters; the extension is skipped (no CUDA)")
    check_sizes = CHECK_SIZES if p.cuda else DRY_CHECK_SIZES
    for adamw in (True, False):
        r = compare_with_torch("numba_cuda", check_sizes, EXT_STEPS, adamw=adamw, device=device)
        p.check(f"numba.cuda{' (simulator)' if numba_cuda.simulator_enabled() else ''} = torch "
                f"{'AdamW' if adamw else 'Adam (L2)'}, sizes {check_sizes}", r["max_rel_error"] <= EXT_REL_TOL,
                r["max_rel_error"], 0.0, f"rel <= {EXT_REL_TOL:g}")
    roof = copy_roofline(p, device, COPY_BYTES if p.cuda else 4 * max(DRY_SIZES))
    p.rec["copy_gbs"] = roof
    methods = list(bench.GPU_METHODS)
    if p.cuda:
        set_arch_list()
        if cuda_ext.built_library() is None and cuda_ext._module is None:
            methods.remove("cuda ext")  # building it here could take minutes: that is the ext part's job
            p.note("cuda ext not timed: it is not built (the ext part builds it)")
    rows = p.table("Adam step throughput (fp32 AdamW; GB/s = 28 bytes per parameter / median step time)",
                   ["params", "tensors", "method", "median ms", "min ms", "GB/s", "× copy", "bytes per step"])
    sizes, tensors = (gpu_sizes, THROUGHPUT_TENSORS) if p.cuda else (DRY_SIZES, DRY_TENSORS)
    for n in sizes:
        for t in tensors:
            if p.cuda and not next(c["fits"] for c in plan if c["params"] == label(n) and c["tensors"] == t):
                p.note(f"skipped {label(n)} × {t}: needs ~{n * BYTES_PER_PARAM_HELD / 1e9:.0f} GB, "
                       f"{free / 1e9:.0f} GB free")
                continue
            # a step of the largest size takes ~10 ms a method; set-up (random init) costs more than the timing
            if not p.within_budget(f"{label(n)} × {t}", needs_s=2 + n / 1e8):
                continue
            if p.cuda:
                fns, skipped = bench.gpu_candidates(n, t, methods=methods)
                times = time_cuda(fns, REPEATS, WARMUP)
            else:
                fns, skipped = _dry_candidates(n, t)
                times = time_cpu(fns, DRY_REPEATS)
            for method, why in skipped.items():
                p.note(f"{label(n)} × {t}: {method} skipped: {why}")
            for method, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
                r = bench.Result(method, n, t, ts, ts)
                p.row(rows, n, t, method, r.median_s * 1e3, min(ts) * 1e3, r.gbs, r.gbs / roof, adam_step_bytes(n))
            del fns
            release_memory()


# ---------------------------------------------------------------- 3. stages

STAGE_STEPS = 5
# One rank against a reference on the same device adds in the same order (0 expected); N ranks average their
# gradients in another order than the single-process batch mean (tests/zero_ref/test_zero_stages.py's CUDA bound).
STAGE_TOL = {1: 1e-5, "many": 1e-4}
# Per-allocation rounding of the CUDA caching allocator (512 bytes), per tensor held.
ALLOCATOR_ROUNDING = 512


def stage_model_config(cuda: bool):
    from zero_ref.models import GPTConfig

    if cuda:  # ~17M parameters: 270 MB of fp32 model states, a few ms a step
        return GPTConfig(vocab_size=8192, seq_len=256, d_model=512, n_heads=8, n_layers=4)
    return GPTConfig(vocab_size=97, seq_len=8, d_model=21, n_heads=3, n_layers=2)  # tests/zero_ref/cases.py's


def stage_adam():
    from zero_ref.optim import AdamConfig

    # eps 1e-6 as in tests/zero_ref/cases.py: with 1e-8 an element whose gradient is ~0 moves ±lr in a direction
    # set by rounding noise, and two correct runs that add in different orders differ there by ~2·lr·steps.
    return AdamConfig(lr=1e-2, weight_decay=0.1, eps=1e-6)


def stage_batch(cfg, step: int, rank: int, world: int, micro: int, device: str):
    from zero_ref.models import make_batch

    idx, targets = make_batch(cfg, micro * world, seed=1000 + step)
    sl = slice(rank * micro, (rank + 1) * micro)
    return idx[sl].to(device), targets[sl].to(device)


def build_model(cfg, device: str):
    from zero_ref.models import GPT

    torch.manual_seed(0)
    return GPT(cfg).to(device)


def reference_state(cfg, world: int, micro: int, device: str) -> dict:
    """Single-process torch.optim.AdamW on each step's whole global batch."""
    adam = stage_adam()
    model = build_model(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=adam.lr, betas=adam.betas, eps=adam.eps,
                            weight_decay=adam.weight_decay, foreach=False)
    for step in range(STAGE_STEPS):
        loss = model(*stage_batch(cfg, step, 0, 1, micro * world, device))[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}


def run_stage(stage: int, cfg, rank: int, world: int, micro: int, device: str) -> dict:
    """STAGE_STEPS steps of ZeRO ``stage`` on this rank; its final state and what it held in memory."""
    from zero_ref.measure import cuda_requested_bytes, unique_storage_bytes
    from zero_ref.stages import STAGES

    cuda = device == "cuda"
    release_memory()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base, base_requested = torch.cuda.memory_allocated(), cuda_requested_bytes()
    model = build_model(cfg, device)
    kw = {"param_persistence_threshold": 0} if stage == 3 else {}  # partition every unit, however small
    opt = STAGES[stage](model, adam=stage_adam(), **kw)
    for step in range(STAGE_STEPS):
        # [1]: the logits are freed at once, or they would count as memory at rest
        loss = model(*stage_batch(cfg, step, rank, world, micro, device))[1]
        opt.backward(loss)
        opt.step()
    del loss
    held_tensors = opt.state_tensors()
    held = {k: unique_storage_bytes(v) for k, v in held_tensors.items()}
    n_tensors = sum(len(v) for v in held_tensors.values())
    del held_tensors
    others = unique_storage_bytes(list(model.buffers()))  # the causal masks
    out = {"held": held, "others": others, "n_tensors": n_tensors,
           "numel": sum(b.layout.numel for b in opt.buckets), "padded": sum(b.layout.padded_numel for b in opt.buckets)}
    if cuda:
        gc.collect()
        torch.cuda.synchronize()
        out["allocated"] = torch.cuda.memory_allocated() - base
        out["requested"] = cuda_requested_bytes() - base_requested
        out["peak"] = torch.cuda.max_memory_allocated() - base
    state = opt.state_dict() if stage == 3 else model.state_dict()
    out["state"] = {k: v.detach().float().cpu().clone() for k, v in state.items()}
    return out


def _stage_rank(rank: int, world: int, port: int, backend: str, stages: list, micro: int, out: str) -> None:
    """One rank of a multi-rank run (torch.multiprocessing.spawn target: module level, picklable)."""
    device = "cuda" if backend == "nccl" else "cpu"
    cfg = stage_model_config(device == "cuda")
    with process_group(backend, world, rank, port):
        results = {s: run_stage(s, cfg, rank, world, micro, device) for s in stages}
    if rank == 0:
        torch.save(results, out)


def run_ranks(world: int, backend: str, stages: list, micro: int, timeout_s: float = 240) -> dict:
    """Rank 0's results of ``world`` spawned ranks (fresh interpreters: the spawn start method)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        ctx = mp.start_processes(_stage_rank, args=(world, free_port(), backend, stages, micro, out), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                raise TimeoutError(f"{world} ranks did not finish in {timeout_s:.0f} s")
        return torch.load(out)


def report_stage(p: Part, rows_eq, rows_mem, stage: int, world: int, r: dict, ref: dict, cuda: bool) -> None:
    from zero_ref.memory import model_state_bytes

    diff = max((r["state"][k] - ref[k]).abs().max().item() for k in ref)
    equal = all(torch.equal(r["state"][k], ref[k]) for k in ref)
    tol = STAGE_TOL[1 if world == 1 else "many"]
    p.row(rows_eq, stage, world, diff, equal)
    p.check(f"stage {stage}, {world} rank{'s' * (world > 1)} = torch AdamW", diff <= tol, diff, 0.0,
            f"max |Δ| <= {tol:g} over {STAGE_STEPS} steps")
    formula = model_state_bytes(r["numel"], zero_stage=stage, dp=world, precision="fp32")
    padded = model_state_bytes(r["padded"], zero_stage=stage, dp=world, precision="fp32")
    held = sum(r["held"].values())
    p.check(f"stage {stage}, {world} rank{'s' * (world > 1)}: model states held = formula (padded Ψ)",
            r["held"] == {"params": padded.params, "grads": padded.grads, "optimizer": padded.optimizer},
            held, padded.total, "exact, by category")
    allocated, requested = r.get("allocated"), r.get("requested")
    if requested is not None:
        slack = ALLOCATOR_ROUNDING * (r["n_tensors"] + 16)
        p.check(f"stage {stage}, {world} rank{'s' * (world > 1)}: CUDA memory at rest = formula + buffers",
                abs(requested - r["others"] - padded.total) <= slack, requested - r["others"], padded.total,
                f"requested bytes, ± {slack:,} (512 per allocation)")
    cpu = "n/a (CPU)"
    p.row(rows_mem, stage, world, r["numel"], r["padded"], formula.total, padded.total, held,
          cpu if requested is None else requested - r["others"], cpu if allocated is None else allocated - r["others"],
          cpu if allocated is None else r["peak"])


def part_stages(p: Part) -> None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cfg = stage_model_config(p.cuda or not p.dry_run)
    micro = 8 if (p.cuda or not p.dry_run) else 2
    worlds = [1] + ([gpus] if gpus > 1 and not p.dry_run else [])  # one rank, then every GPU
    p.plan(model=f"GPT {cfg}", parameters=cfg.num_params(), steps=STAGE_STEPS, micro_batch=micro,
           backend="nccl" if not p.dry_run else "gloo (dry run)", worlds=worlds,
           adam=str(stage_adam()), reference="torch.optim.AdamW(foreach=False), one process, the global batch",
           tolerance=f"max |Δ| <= {STAGE_TOL[1]:g} on 1 rank, {STAGE_TOL['many']:g} on more",
           memory="state_tensors() = model_state_bytes(padded Ψ, stage, dp, 'fp32') exactly; "
                  "the bytes live CUDA tensors requested at rest (memory_stats' requested_bytes) - buffers = the "
                  "same ± 512 bytes per allocation; memory_allocated (the allocator's blocks) and "
                  "max_memory_allocated (peak, with activations and buckets) recorded")
    if not p.cuda and not p.dry_run:
        p.need_cuda()
    device, backend = ("cuda", "nccl") if p.cuda else ("cpu", "gloo")
    rows_eq = p.table("ZeRO stage against single-process AdamW", ["stage", "ranks", "max |Δ|", "bit-equal"])
    rows_mem = p.table("Model states per rank (bytes, fp32: 16 per parameter before sharding)",
                       ["stage", "ranks", "Ψ", "padded Ψ", "formula(Ψ)", "formula(padded)", "state_tensors",
                        "requested at rest - buffers", "allocated at rest - buffers", "peak allocated"])
    ref = reference_state(cfg, 1, micro, device)
    with process_group(backend):
        for stage in range(4):
            if p.within_budget(f"stage {stage} on 1 rank"):
                report_stage(p, rows_eq, rows_mem, stage, 1, run_stage(stage, cfg, 0, 1, micro, device), ref, p.cuda)
    if len(worlds) == 1:
        p.note(f"{gpus} GPU{'s' * (gpus != 1)}: multi-rank skipped" if not p.dry_run else
               "dry run: multi-rank skipped (1 rank on gloo)")
    for world in worlds[1:]:
        if not p.within_budget(f"{world} ranks", needs_s=30):
            continue
        ref = reference_state(cfg, world, micro, device)
        for stage, r in run_ranks(world, backend, list(range(4)), micro).items():
            report_stage(p, rows_eq, rows_mem, stage, world, r, ref, p.cuda)


# ---------------------------------------------------------------- 4. offload

OFFLOAD_STEPS, OFFLOAD_GAS = 3, 2
LINK_SIZES = [64 << 20, 256 << 20]
QUICK_LINK_SIZES = LINK_SIZES[:1]
LINK_REPEATS = 5


def sim_link_model(gpu_name: str | None):
    """The simulator's cost model of one GPU's host link: the preset node for this GPU (H200 by default)."""
    from sim.spec.hardware import Cluster
    from sim.cost.cost_model import CostModel
    from sim.cost.costs import Costs
    from sim.spec.plan import Plan

    presets = (("H200", "H200-141GB"), ("H100", "H100-80GB"), ("A100", "A100-80GB"), ("V100", "V100-32GB"))
    preset = next((p for key, p in presets if key in (gpu_name or "")), "H200-141GB")
    cluster = Cluster.preset(preset, gpus_per_node=1)
    model = CostModel(cluster, Plan(zero_stage=2, dp=1, offload_optimizer="cpu"), Costs())
    return preset, model


def part_offload(p: Part) -> None:
    from zero_ref import offload
    from zero_ref.stages import STAGES
    from sim.cost.work import Copy

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    preset, cost = sim_link_model(gpu)
    c = cost.costs
    cfg = stage_model_config(p.cuda or not p.dry_run)
    p.plan(model=f"GPT {cfg}", parameters=cfg.num_params(), precision="bf16", stages=[1, 2],
           steps=OFFLOAD_STEPS, gradient_accumulation_steps=OFFLOAD_GAS,
           offload_optimizer={"device": "cpu", "pin_memory": True},
           cpu_adam="numba" if not p.dry_run else "torch (dry run: no Numba compile for a structure check)",
           bytes="Link.d2h_bytes / h2d_bytes per step = zero_ref.memory.pcie_bytes_per_step(padded Ψ), exactly",
           link_sizes=[f"{n >> 20} MiB" for n in p.pick(LINK_SIZES, QUICK_LINK_SIZES, LINK_SIZES)], first_step="includes the Numba CPU Adam's compilation",
           link_model=f"sim.cost.cost_model.CostModel on the {preset} preset: α {c.alpha_pcie:g} s + bytes / "
                      f"({cost.cluster.pcie_bw / 1e9:g} GB/s × {c.pcie_efficiency:g})")
    if not p.cuda and not p.dry_run:
        p.need_cuda()
    device, backend = ("cuda", "nccl") if p.cuda else ("cpu", "gloo")
    rows = p.table("bytes over the host link per step (one rank)", ["stage", "step", "d2h", "h2d",
                                                                    "formula d2h", "formula h2d", "step ms"])
    with process_group(backend):
        for stage in (1, 2):
            if not p.within_budget(f"stage {stage}"):
                continue
            model = build_model(cfg, device)
            opt = STAGES[stage](model, adam=stage_adam(), precision="bf16", gradient_accumulation_steps=OFFLOAD_GAS,
                                offload_optimizer={"device": "cpu", "pin_memory": True},
                                cpu_adam="numba" if p.cuda else "torch")
            link = opt.offload.link
            padded = sum(b.layout.padded_numel for b in opt.buckets)
            want = offload.pcie_bytes_per_step(padded, zero_stage=stage, dp=1, precision="bf16",
                                               gradient_accumulation_steps=OFFLOAD_GAS)
            per_step = []
            for step in range(OFFLOAD_STEPS):
                before = (link.d2h_bytes, link.h2d_bytes)
                t0 = time.perf_counter()
                for micro in range(OFFLOAD_GAS):
                    loss = model(*stage_batch(cfg, step * OFFLOAD_GAS + micro, 0, 1, 2, device))[1]
                    opt.backward(loss)
                    opt.step()
                if p.cuda:
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3
                per_step.append([link.d2h_bytes - before[0], link.h2d_bytes - before[1]])
                p.row(rows, stage, step + 1, *per_step[-1], want["d2h"], want["h2d"], ms)
            p.check(f"stage {stage}: bytes per step = pcie_bytes_per_step, every step",
                    all(got == [want["d2h"], want["h2d"]] for got in per_step), per_step, [want["d2h"], want["h2d"]],
                    "exact (d2h, h2d)")
            del model, opt, loss
            release_memory()
    p.need_cuda("the link timing (pinned host buffers, the copy stream)")
    rows = p.table("host link copies against the simulator's link model",
                   ["what", "bytes", "median ms", "GB/s", "model ms", "measured / model"])
    link = offload.Link(torch.device("cuda"), pin_memory=True)
    for n in p.pick(LINK_SIZES, QUICK_LINK_SIZES, LINK_SIZES):
        if not p.within_budget(f"link copies of {n >> 20} MiB", needs_s=5):
            continue
        dev = torch.empty(n // 2, dtype=torch.bfloat16, device="cuda")
        host32 = torch.randn(n // 2)
        pinned = torch.empty(n // 2, dtype=torch.bfloat16, pin_memory=True)
        stream = link.stream

        def raw(direction):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                start.record(stream)
                if direction == "d2h":
                    pinned.copy_(dev, non_blocking=True)
                else:
                    dev.copy_(pinned, non_blocking=True)
                end.record(stream)
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        def via_link(direction):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if direction == "d2h":
                link.to_host(dev, lambda host: None)
                link.poll(wait=True)
            else:
                link.to_device(dev, host32)  # casts to bf16 on the host first: 16-bit values cross the link
                torch.cuda.synchronize()
                link.poll(wait=True)  # hand its pinned staging buffer back
            return time.perf_counter() - t0

        for what, fn, direction in (("raw pinned D2H (copy stream)", raw, "d2h"),
                                    ("raw pinned H2D (copy stream)", raw, "h2d"),
                                    ("Link.to_host + poll (zero_ref)", via_link, "d2h"),
                                    ("Link.to_device incl. host cast (zero_ref)", via_link, "h2d")):
            fn(direction)  # warm-up: pinned buffers from the caching host allocator
            s = statistics.median(fn(direction) for _ in range(LINK_REPEATS))
            model_s = cost.duration(Copy(direction, n))
            p.row(rows, what, n, s * 1e3, n / s / 1e9, model_s * 1e3, s / model_s)
        del dev, host32, pinned
        release_memory()


# ---------------------------------------------------------------- 5. activations

ACT_SHAPES = [(1024, 4, 1024, 16), (2048, 2, 1536, 12)]  # (s, b, h, a): head dim 64 and 128, flash-eligible
DRY_ACT_SHAPES = [(16, 2, 64, 4)]
ACT_DROPOUT = 0.1


class SDPAttention(torch.nn.Module):
    """zero_ref's attention through ``F.scaled_dot_product_attention`` (causal), same weights and dropout."""

    def __init__(self, attn):
        super().__init__()
        self.n_heads, self.p, self.qkv, self.proj = attn.n_heads, attn.p, attn.qkv, attn.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from zero_ref.models.dropout import dropout

        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                                             is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return dropout(self.proj(y), self.p, self.training)


def saved_by_block(block, x):
    """What autograd saves in one forward of ``block`` (then the backward, to show it is what backward needs)."""
    from zero_ref.measure import saved_activation_bytes

    with saved_activation_bytes(block) as acts:
        y = block(x)
    y.float().sum().backward()
    return acts


def part_activations(p: Part) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from zero_ref.memory import activation_bytes_per_layer
    from zero_ref.models import Block, GPTConfig

    shapes = p.pick(ACT_SHAPES, ACT_SHAPES[:1], DRY_ACT_SHAPES)
    p.plan(shapes_sbha=shapes, dtype="bf16 model (not autocast)", dropout=ACT_DROPOUT,
           explicit="zero_ref's Block = activation_bytes_per_layer(s, b, h, a) + LayerNorm mean/rstd "
                    "(2 × 2 × sb × 4 bytes on CUDA, × 2 bytes on the CPU), exactly",
           sdpa="flash kernel (sdpa_kernel(FLASH_ATTENTION)) = activation_bytes_per_layer(..., recompute="
                "'selective') + LayerNorm stats + logsumexp (fp32, b·a·s) + ≤ 64 bytes of RNG state",
           dry_run_sdpa="the math kernel on the CPU: recorded, not compared (it saves the probabilities)")
    if not p.cuda and not p.dry_run:
        p.need_cuda()
    device = "cuda" if p.cuda else "cpu"
    rows = p.table("saved activation bytes per block", ["s", "b", "h", "a", "attention", "measured",
                                                        "formula", "expected", "measured - expected"])
    for s, b, h, a in shapes:
        if not p.within_budget(f"shape {(s, b, h, a)}", needs_s=3):
            continue
        cfg = GPTConfig(seq_len=s, d_model=h, n_heads=a, dropout=ACT_DROPOUT)
        torch.manual_seed(0)
        block = Block(cfg).to(device=device, dtype=torch.bfloat16).train()
        x = torch.randn(b, s, h, dtype=torch.bfloat16, device=device, requires_grad=True)
        ln_stats = 2 * 2 * s * b * (4 if p.cuda else 2)
        full = activation_bytes_per_layer(s, b, h, a)
        acts = saved_by_block(block, x)
        expected = full + ln_stats
        p.row(rows, s, b, h, a, "explicit (zero_ref)", acts.total, full, expected, acts.total - expected)
        p.check(f"explicit attention {(s, b, h, a)}: saved = 34sbh + 5as²b + LN stats", acts.total == expected,
                acts.total, expected, "exact")
        block.attn = SDPAttention(block.attn)
        if p.cuda:
            kernels = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
        else:
            kernels = [("math", SDPBackend.MATH)]
        for name, backend in kernels:
            try:
                with sdpa_kernel([backend]):
                    acts = saved_by_block(block, x)
            except RuntimeError as e:
                p.note(f"sdpa {name} kernel not available for {(s, b, h, a)}: {str(e).splitlines()[0]}")
                continue
            selective = activation_bytes_per_layer(s, b, h, a, recompute="selective")
            if name == "math":
                p.row(rows, s, b, h, a, "sdpa math (recorded)", acts.total, selective, "", "")
                break
            lse_seq = s if name == "flash" else -(-s // 32) * 32  # the efficient kernel pads logsumexp to 32
            expected = selective + ln_stats + 4 * b * a * lse_seq
            p.row(rows, s, b, h, a, f"sdpa {name}", acts.total, selective, expected, acts.total - expected)
            p.check(f"sdpa {name} {(s, b, h, a)}: saved = 34sbh + LN stats + logsumexp (+ RNG state)",
                    0 <= acts.total - expected <= 64, acts.total, expected, "0 to +64 bytes (RNG seed/offset)")
            if name == "flash":
                p.rec.setdefault("flash_items", []).append(
                    {"shape": [s, b, h, a], "items": [[list(i.shape), str(i.dtype), i.nbytes] for i in acts.items]})
                break  # flash ran: the efficient kernel is only the fallback
        del block, x, acts
        release_memory()


# ---------------------------------------------------------------- driver

PARTS = {"ext": part_ext, "adam_throughput": part_adam_throughput, "stages": part_stages,
         "offload": part_offload, "activations": part_activations}
BUDGETS_S = {"ext": 200, "adam_throughput": 90, "stages": 60, "offload": 45, "activations": 30}
# Cheap parts first: a slow compile in ext cannot starve them. adam_throughput last: it times the extension
# ext built, and its 1024M-parameter steps are the likeliest to leave a sticky CUDA error no later part survives.
RUN_ORDER = ("stages", "offload", "activations", "ext", "adam_throughput")


def run_part(name: str, fn, report: dict, out_dir: Path, device: str | None, dry_run: bool,
             quick: bool = False, fail: bool = False) -> None:
    record: dict = {}
    report["parts"][name] = record
    part = Part(name, BUDGETS_S.get(name, 60), device, dry_run, record, quick=quick, fail=fail)
    write_report(out_dir, report)  # the part shows as running if the watchdog ends the run inside it
    try:
        fn(part)
        record["status"] = "ok"
    except Skip as e:
        did_work = record["checks"] or any(t["rows"] for t in record["tables"])
        record["status"] = f"{'partly skipped' if did_work else 'skipped'}: {e}"
        part.log(record["status"])
    except Exception as e:  # noqa: BLE001 - one part's failure is recorded; the others still run
        record["status"] = "failed"
        record["traceback"] = traceback.format_exc()
        part.log(f"FAILED: {type(e).__name__}: {e}")
    finally:
        record["seconds"] = time.perf_counter() - part.t0
        release_memory()
    write_report(out_dir, report)


def _watchdog(limit_s: float, out_dir: Path, report: dict, exit=os._exit) -> threading.Timer:
    """After ``limit_s``: record where the run was, write the reports and ``exit(3)`` (the whole process:
    the main thread may be inside a compile or a collective that nothing else can interrupt)."""
    def fire():
        frames = sys._current_frames()
        stack = "".join(traceback.format_stack(frames[threading.main_thread().ident]))
        for rec in report["parts"].values():
            if rec.get("status") == "running":
                rec.update(status="timed out", traceback=f"stopped after {limit_s:.0f} s in:\n{stack}")
        report["finished"] = "timed out"
        try:
            write_report(out_dir, report)
        finally:
            print(f"gpu_check: time limit of {limit_s:.0f} s reached; reports written", flush=True)
            exit(3)

    timer = threading.Timer(limit_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def parse_parts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(unknown) or '(none)'}; "
                                         f"choose from {', '.join(PARTS)}")
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, dest="out_dir", metavar="DIR",
                    help=f"folder for {RESULTS_JSON} and {RESULTS_MD} (made if missing)")
    ap.add_argument("--dry-run", action="store_true", help="the structure on the CPU, tiny sizes (no GPU needed)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer sizes: Adam at 16M and 256M, one link size, one activation shape, two extension checks")
    ap.add_argument("--fail-part", type=parse_parts, default=[], metavar="PART[,PART]",
                    help="make these parts raise after recording their plan (checks that the others still run)")
    ap.add_argument("--parts", type=parse_parts, default=list(RUN_ORDER),
                    help=f"comma-separated, run in this order (default {','.join(RUN_ORDER)})")
    ap.add_argument("--time-limit", type=float, default=470.0, help="seconds before the run stops itself")
    args = ap.parse_args(argv)
    if args.dry_run:
        # read by numba when it is first imported: numba.cuda's kernel then runs in the simulator on CPU tensors
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
        # tiny tensors: more intra-op threads only add OpenMP hand-offs (slow on a busy machine)
        torch.set_num_threads(1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry_run else ("cuda" if torch.cuda.is_available() else None)
    t0 = time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    report = {"script": "scripts/gpu_check.py", "argv": argv,
              "command": shlex.join(["python3", "scripts/gpu_check.py", *map(str, argv)]),
              "dry_run": args.dry_run, "quick": args.quick, "note": DRY_RUN_NOTE if args.dry_run else "measured on the machine below",
              "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_facts(),
              "parts": {}}
    print(f"gpu_check: {report['machine'].get('gpu') or 'no GPU'}, torch {torch.__version__}, parts "
          f"{', '.join(args.parts)}{' (DRY RUN: structure check on the CPU)' if args.dry_run else ''}", flush=True)
    timer = _watchdog(args.time_limit, args.out_dir, report)
    try:
        for name in args.parts:
            run_part(name, PARTS[name], report, args.out_dir, device, args.dry_run, quick=args.quick,
                     fail=name in args.fail_part)
    finally:
        timer.cancel()
    report["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    report["wall_s"] = time.perf_counter() - t0
    write_report(args.out_dir, report)
    failed = [n for n, r in report["parts"].items() if r["status"] == "failed"]
    misses = [f"{n}: {c['check']}" for n, r in report["parts"].items() for c in r["checks"] if not c["ok"]]
    print(f"gpu_check: {len(report['parts'])} parts in {report['wall_s']:.0f} s; "
          f"failed: {', '.join(failed) or 'none'}; checks not met: {len(misses)}; "
          f"wrote {args.out_dir / RESULTS_JSON} and {RESULTS_MD}", flush=True)
    for m in misses:
        print(f"  FAIL {m}", flush=True)
    return 1 if failed or misses else 0


if __name__ == "__main__":
    sys.exit(main())
