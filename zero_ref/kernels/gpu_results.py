"""The stored GPU check: where ``scripts/gpu_check.py``'s results live in the repository, and their summary.

    from zero_ref.kernels import gpu_results
    print(gpu_results.show())   # the stored table, or a line saying none is stored and how to make one

``make gpu-check OUT=benchmarks/gpu`` on a GPU machine writes ``results.json`` and ``results.md`` there;
committed, they are what chapter 14 and ``benchmarks/README.md`` show. Every line of the summary comes
from that file: the machine, the date, the versions and the command are the run's own.
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "benchmarks" / "gpu"
COMMAND = "make gpu-check OUT=benchmarks/gpu"
THROUGHPUT = "adam_throughput"


def load(folder: Path = STORED) -> dict | None:
    """The stored ``results.json`` (None when there is none)."""
    path = Path(folder) / "results.json"
    return json.loads(path.read_text()) if path.exists() else None


def header(report: dict) -> list[str]:
    """What was measured where, when and how: the lines every rendering of a report starts with."""
    m = report["machine"]
    gpu = m.get("gpu") or "no GPU"
    if m.get("gpu"):
        gpu += (f" × {m['gpu_count']}, compute capability {m['capability']}, "
                f"{m['gpu_memory_bytes'] / 2**30:.0f} GiB")
    kind = ("dry run on the CPU (no GPU measurement)" if report["dry_run"]
            else "stored measurement" + (" (--quick)" if report.get("quick") else ""))
    return [f"- **{kind}**, started {report['started']}",
            f"- machine: {gpu}; {m['cpu_count']} CPUs; {m['platform']}",
            f"- torch {m['torch']} (CUDA {m['torch_cuda']}), numba {m.get('numba')}, Python {m['python']}",
            f"- command: `{report.get('command', '(not recorded)')}`; sources sha256 "
            f"{m.get('source_digest', 'unknown')[:12]} (scripts/gpu_check.py source_digest); HEAD of the copy "
            f"that ran: {(m.get('git_commit') or 'unknown')[:12]}"]


def summary(report: dict, leave_out=()) -> str:
    """The header, each part's status and checks, and the Adam throughput table (GB/s against the copy),
    without the rows whose ``(method, tensors)`` is in ``leave_out``."""
    lines = header(report) + [""]
    for name, part in report["parts"].items():
        checks = part.get("checks", [])
        lines.append(f"{name:<16} {part.get('status')}; checks passed {sum(c['ok'] for c in checks)}/{len(checks)}")
    part = report["parts"].get(THROUGHPUT, {})
    if part.get("copy_gbs"):
        where = "host copy (dry run)" if report["dry_run"] else "device-to-device copy"
        lines += ["", f"{where}: {part['copy_gbs']:,.0f} GB/s (bytes read + written over the median time)"]
    for table in part.get("tables", [])[:1]:
        lines += ["", table["title"], f"{'params':>8} {'tensors':>8}  {'method':<14}{'median ms':>10} {'GB/s':>8}"
                                      f" {'× copy':>7}"]
        for n, t, method, median_ms, _, gbs, of_copy, _ in table["rows"]:
            if (method, t) in leave_out:
                continue
            size = f"{n >> 20}M" if n % (1 << 20) == 0 else f"{n:,}"
            lines.append(f"{size:>8} {t:>8}  {method:<14}{median_ms:>10.3f} {gbs:>8,.0f} {of_copy:>7.2f}")
    return "\n".join(lines)


def show(folder: Path = STORED, leave_out=()) -> str:
    """The stored summary, or one line saying that none is stored and which command makes one."""
    report = load(folder)
    if report is None:
        where = Path(folder).resolve()
        where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
        return f"No GPU measurement is stored yet ({where / 'results.json'} does not exist). On a GPU machine: {COMMAND}"
    return summary(report, leave_out)
