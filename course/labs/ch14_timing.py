"""Chapter 14's timing tables: every method against the stream kernel of the same rounds, with the spread.

``bench.measure_cpu`` times the methods and the stream kernel round-robin; a method's fraction of the stream rate
is taken round by round (the two ran within a second of each other, under the same load) and summarized by its
median and its range over the rounds, so the table shows how far this run's load moved it. ``page_faults``
counts the fresh pages a step touches, ``stored_rows`` reads the stored benchmark (DeepSpeedCPUAdam included).
"""
import re
import resource
import statistics
from pathlib import Path

from zero_ref.kernels import bench

FUSED, UNFUSED = ("numba", "torch fused"), ("torch for-loop", "torch foreach")
README = Path(__file__).resolve().parents[2] / "benchmarks" / "README.md"


def of_stream(results: dict) -> dict[str, list[float]]:
    """Per method: stream time / method time, round by round (1 = as fast as the 4-read, 3-write stream kernel)."""
    stream = results[bench.STREAM].seconds
    return {m: [s / t for s, t in zip(stream, r.seconds)] for m, r in results.items() if m != bench.STREAM}


def print_table(results: dict, n_params: int, tensors: int) -> None:
    """Median step time and its range, effective GB/s, the per-round fraction of the stream rate, and a verdict."""
    stream, ratios = results[bench.STREAM], of_stream(results)
    gbs = sorted(28 * n_params / t / 1e9 for t in stream.seconds)
    print(f"{n_params >> 20}M parameters in {tensors} tensor(s), {len(gbs)} rounds: stream kernel "
          f"{stream.gbs:.1f} GB/s (median round; rounds {gbs[0]:.1f} to {gbs[-1]:.1f})")
    print(f"  {'method':<16}{'ms/step':>9}{'rounds':>19}{'GB/s':>7}{'x stream':>10}{'rounds':>13}")
    for m in sorted(ratios, key=lambda m: results[m].median_s):
        r, rs = results[m], ratios[m]
        print(f"  {m:<16}{r.median_s * 1e3:>9.2f}{f'{min(r.seconds) * 1e3:.1f} to {max(r.seconds) * 1e3:.1f}':>19}"
              f"{r.gbs:>7.1f}{statistics.median(rs):>10.2f}{f'{min(rs):.2f} to {max(rs):.2f}':>13}")
    fused = [statistics.median(ratios[m]) for m in FUSED if m in ratios]
    unfused = [statistics.median(ratios[m]) for m in UNFUSED if m in ratios]
    print(f"  -> fused at {min(fused):.2f} to {max(fused):.2f} of the stream rate (median rounds); op-by-op at "
          f"{min(unfused):.2f} to {max(unfused):.2f}, where 84 bytes instead of 28 alone would allow {28 / 84:.2f}")


def page_faults(step, calls: int = 3) -> float:
    """Minor page faults per call of ``step`` (after two warm-up calls): fresh 4 KiB pages the step touched."""
    step(), step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def stored_rows(config: str, methods) -> str:
    """The rows of ``methods`` from the stored table of ``benchmarks/README.md`` headed ``config`` (e.g. '16M
    parameters in 1 tensor'), with its heading and column names."""
    text = README.read_text()
    start = text.index(f"**{config} ")
    block = text[start:text.index("\n\n", text.index("| method", start))]
    lines = block.splitlines()
    keep = [lines[0].strip("*"), lines[2]] + [ln for ln in lines[4:]
                                              if re.sub(r"[*|]", "", ln.split("|")[1]).strip() in methods]
    return "\n".join(keep)
