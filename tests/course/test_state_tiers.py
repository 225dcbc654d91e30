"""tier_chart stacks each tier's parameters, gradients and optimizer states, in GB."""
import matplotlib
import pytest

from course.labs.state_tiers import tier_chart
from zero_ref.memory import offload_placement

matplotlib.use("Agg")


def test_tier_chart_stacks_the_bytes_of_each_tier():
    tiers = offload_placement(7 * 10**9, zero_stage=3, dp=8, precision="bf16", offload_optimizer="cpu",
                              offload_param="nvme")
    ax = tier_chart(tiers)
    bars = ax.patches                                   # params on GPU, CPU, NVMe, then grads, then optimizer
    assert len(bars) == 9
    for k, cat in enumerate(("params", "grads", "optimizer")):
        for j, tier in enumerate(("gpu", "cpu", "nvme")):
            bar = bars[3 * k + j]
            assert bar.get_width() == pytest.approx(getattr(tiers[tier], cat) / 1e9)
            below = sum(getattr(tiers[tier], c) for c in ("params", "grads", "optimizer")[:k]) / 1e9
            assert bar.get_x() == pytest.approx(below)
    total = {t: max(b.get_x() + b.get_width() for b in bars[j::3]) for j, t in enumerate(("gpu", "cpu", "nvme"))}
    assert total == pytest.approx({t: tiers[t].total / 1e9 for t in total})
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["params", "grads", "optimizer"]
    matplotlib.pyplot.close(ax.figure)
