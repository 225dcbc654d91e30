"""Chapter 8's ladder helpers: the bytes a rank sent, the chart of the rungs, and one measured step per stage."""
from types import SimpleNamespace

import matplotlib
import pytest

import zero_ref
from course.labs.zero_ladder import ladder_chart, ladder_run, sent_bytes
from zero_ref.memory import GiB, model_state_bytes

matplotlib.use("Agg")


def test_sent_bytes_splits_bf16_data_from_control():
    records = [("all_reduce", "bfloat16", 100.0), ("all_gather", "bfloat16", 50.0),
               ("all_reduce", "float32", 16.0), ("all_gather", "int64", 24.0)]
    assert sent_bytes(records) == (150.0, 40.0)
    assert sent_bytes([]) == (0, 0)


def _rung(name, gib, fits, fits_gpu):
    return SimpleNamespace(rung=SimpleNamespace(name=name), gpu_bytes=gib * GiB, fits=fits, fits_gpu=fits_gpu)


def test_ladder_chart_draws_each_rung_against_the_usable_memory():
    steps = [_rung("DDP (ZeRO-0)", 200, False, False), _rung("ZeRO-3", 30, False, True),
             _rung("ZeRO-3 + opt→CPU", 8, True, True)]
    ax = ladder_chart(steps, 80 * 10**9, first_fit=steps[2])
    heights = [bar.get_height() for bar in ax.patches]
    assert heights == pytest.approx([200, 30, 8])
    colors = [matplotlib.colors.to_hex(bar.get_facecolor()) for bar in ax.patches]
    assert colors == [matplotlib.colors.to_hex(c) for c in ("tab:red", "tab:orange", "tab:green")]
    usable = 0.9 * 80 * 10**9 / GiB
    assert ax.lines[0].get_ydata()[0] == pytest.approx(usable)
    assert ax.texts[0].get_text() == f"usable {usable:.0f} GiB"
    assert ax.texts[1].get_text() == "first fit" and ax.texts[1].xy[0] == 2
    matplotlib.pyplot.close(ax.figure)


@pytest.mark.slow
def test_ladder_run_holds_the_formula_bytes_on_two_ranks():
    widths = (8, 16, 8)
    psi = sum(a * b + b for a, b in zip(widths, widths[1:]))
    ranks = zero_ref.launch(ladder_run, 2, widths, timeout=120)
    assert ranks[0] == ranks[1]
    for stage, (held, records) in ranks[0].items():
        f = model_state_bytes(psi, zero_stage=stage, dp=2, precision="bf16")
        assert held == {"params": f.params, "grads": f.grads, "optimizer": f.optimizer}, stage
        data, _ = sent_bytes(records)
        assert data == (3 if stage == 3 else 2) * (2 - 1) / 2 * 2 * psi, stage
