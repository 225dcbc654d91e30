"""Validation rung 3: the simulator against published Megatron-LM measurements.

The cost model is calibrated on two rows only (Korthikanti et al. Table 5: 22B and 175B with
sequence parallelism + selective recomputation) and then predicts every other published row
(sim.published: the rest of Table 5 and Narayanan et al.'s Table 1). The bounds below are the
errors reached, not targets chosen to pass: see the comments on each.
"""

import numpy as np
import pytest

import sim
from sim import calibrate, published as pub
from sim.cost import CostModel, layer_elementwise_bytes
from sim.graph import KINDS, STREAMS


# ---------------------------------------------------------------- the data


def test_published_rows_are_consistent_with_their_papers():
    """Table 5's present-work MFU/HFU follow from its iteration times through Korthikanti's formulas
    (so the configurations we transcribed are the ones measured), and Table 1's aggregate PFLOP/s is
    GPUs × TFLOP/s per GPU."""
    for run in pub.KORTHIKANTI_TABLE5:
        rep = dict(run.reported)
        if "mfu" in rep:
            model = run.model()
            mfu = pub.megatron_flops(model, run.global_batch) / (run.gpus * run.iteration_time) / pub.A100_PEAK
            hfu = (pub.megatron_flops(model, run.global_batch, "selective")
                   / (run.gpus * run.iteration_time) / pub.A100_PEAK)
            # the times are rounded to 10 ms (1.10 s is 1.095-1.105: ±0.45 %), MFU/HFU to 0.1 %
            assert mfu == pytest.approx(rep["mfu"], abs=0.002), run.name
            assert hfu == pytest.approx(rep["hfu"], abs=0.002), run.name
        assert run.dp == 1 and run.gpus == run.tp * run.pp
    for run in pub.NARAYANAN_TABLE1:
        rep = dict(run.reported)
        assert run.gpus * run.tflops_per_gpu / 1e3 == pytest.approx(rep["aggregate_pflops"], rel=0.01), run.name
        assert run.tflops_per_gpu / 312 == pytest.approx(rep["percent_of_peak"], abs=0.006), run.name
        assert run.layers % (run.pp * run.virtual) == 0 and run.num_microbatches % run.pp == 0


def test_megatron_flops_formula_equals_the_simulators_count():
    """72Bslh²(1 + s/6h + V/12lh) is exactly what sim counts as model FLOPs (GPT, f = 4h)."""
    run = pub.get("korthikanti-175B-seqsel")
    r = sim.simulate(run.model(), run.cluster(), run.plan(), calibrate.calibrate(), granularity="stage")
    assert r.tflops_per_gpu == pytest.approx(run.tflops_from_time(r.step_time), rel=1e-12)


# ---------------------------------------------------------------- what the graph models


def small(tp=2, pp=2, sp=True, recompute="selective", m=4):
    model = sim.Model("small", layers=4, hidden=512, heads=8, vocab=1000, seq=256)
    plan = sim.Plan(tp=tp, pp=pp, num_microbatches=m, sequence_parallel=sp, recompute=recompute)
    cluster = sim.Cluster.preset("A100-80GB", nodes=1, gpus_per_node=tp * pp)
    return model, cluster, plan


def test_elementwise_kernels_take_hbm_time_and_vanish_in_compute_only():
    model, cluster, plan = small()
    ew = layer_elementwise_bytes(model, 1, tp=2, sp=True)
    x, A = 2 * 256 * 512 / 2, 2 * 8 * 256 * 256 / 2          # one 16-bit s·b·h/t and a·s²·b/t tensor
    assert ew["attention_core"] == 5 * A + A / 2
    assert ew["forward"] == 10 * x + x + 2 * 4 * x + 6 * A + A / 2
    cm = CostModel(cluster, plan, sim.Costs(efficiency=0.5, hbm_efficiency=0.5))
    assert cm.duration(("compute", 312e12, 1e9, 1)) == pytest.approx(2 + 1e9 / (cluster.gpu.hbm_bw * 0.5))
    assert cm.duration(("compute", 312e12, "", 1)) == pytest.approx(2)
    free = CostModel(cluster, plan, sim.Costs.compute_only())
    assert free.duration(("compute", 312e12, 1e9, 1)) == pytest.approx(2)
    # without SP the LayerNorm/dropout tensors are whole on every TP rank: more bytes per rank
    assert layer_elementwise_bytes(model, 1, tp=2, sp=False)["forward"] > ew["forward"]


def test_tp_collectives_block_the_next_compute_and_p2p_sends_one_tp_share():
    model, cluster, plan = small(sp=False, recompute="none")
    r = sim.simulate(model, cluster, plan, sim.Costs(), granularity="stage")
    g = r.graph
    tp_comm, compute = STREAMS.index("tp_comm"), STREAMS.index("compute")
    for s in range(plan.pp):
        nodes = [i for i in range(len(g)) if g.stage[i] == s and g.stream[i] in (tp_comm, compute)]
        for a, b in zip(nodes, nodes[1:]):  # compute and TP collectives alternate, never overlap
            assert r.start[b] >= r.end[a] - 1e-15
    sends = {g.works[g.work[i]] for i in range(len(g)) if KINDS[g.kind[i]] in ("send_fwd", "send_bwd")}
    assert sends == {("p2p", 2 * 256 * 512 / 2, "pp", 1)}  # 16-bit b·s·h / t (scatter/gather)


# ---------------------------------------------------------------- calibration and validation


@pytest.fixture(scope="module")
def fitted():
    return calibrate.fit()


@pytest.fixture(scope="module")
def report(fitted):
    return calibrate.validate(fitted.costs)


def test_calibration_sees_only_the_two_calibration_rows(monkeypatch):
    seen = set()
    real = calibrate.predict

    def spy(run, costs, g=None):
        seen.add(run.name)
        return real(run, costs, g)

    monkeypatch.setattr(calibrate, "predict", spy)
    calibrate.fit()
    assert seen == set(calibrate.CALIBRATION) == {"korthikanti-22B-seqsel", "korthikanti-175B-seqsel"}
    assert not seen & {r.name for r in calibrate.held_out()}
    assert len(calibrate.held_out()) == len(pub.ALL) - 2 == 16


def test_calibration_rows_are_reproduced_and_the_constants_are_physical(fitted):
    """Two rows, two constants: the solve is exact (this only shows it converged)."""
    for name in calibrate.CALIBRATION:
        run = pub.get(name)
        assert calibrate.predict(run, fitted.costs) == pytest.approx(run.iteration_time, rel=0.02)
    assert np.abs(fitted.residuals).max() < 1e-6
    # GEMMs at ~70 % of 312 TFLOP/s; collectives at ~58 % of NVLink's 300 GB/s: plausible for A100s
    assert 0.6 < fitted.values["efficiency"] < 0.8
    assert 0.4 < fitted.values["bandwidth"] < 0.8
    assert fitted.costs.nvlink_efficiency == fitted.costs.ib_efficiency == fitted.values["bandwidth"]
    # the layer's share of peak grows with its size through the element-wise kernels
    eff = [calibrate.effective_efficiency(n, fitted.costs) for n in
           ("korthikanti-22B-seqsel", "korthikanti-175B-seqsel", "korthikanti-1T-seqsel")]
    assert eff == sorted(eff) and eff[-1] < fitted.values["efficiency"]


def test_held_out_rows_are_predicted_within_the_error_reached(report):
    """Achieved on the 16 held-out rows: MAPE 4.0 % on iteration time, 3.9 % on TFLOP/s per GPU
    (issue target ≤ 10 %). The worst rows are Korthikanti's 1T (full +9.9 %, SP+selective +8.2 %)
    and 22B full (+7.0 %): the sim is slow where Megatron 2022 overlapped backward collectives
    with weight-gradient GEMMs, and it cannot see that the 1T's 2.5×-larger GEMMs run faster than
    the calibration rows' (see sim.calibrate)."""
    assert report.mape_time <= 0.045
    assert report.mape_tflops <= 0.045
    assert report.subset("korthikanti").mape_time <= 0.07
    assert report.subset("narayanan").mape_time <= 0.03
    assert max(abs(r.time_error) for r in report.rows) <= 0.105
    assert len(report.rows) == 16 and not {r.name for r in report.rows} & set(calibrate.CALIBRATION)
    for r in report.rows:  # the TFLOP/s error is the time error, inverted
        assert (1 + r.tflops_error) * (1 + r.time_error) == pytest.approx(1)
    assert "MAPE over 16 rows" in report.table()


def test_predict_is_simulate_and_deterministic(fitted):
    run = pub.get("narayanan-39.1B")
    r = sim.simulate(run.model(), run.cluster(), run.plan(), fitted.costs, granularity=calibrate.granularity(run))
    assert calibrate.predict(run, fitted.costs) == r.step_time
    assert calibrate.fit().values == fitted.values


def test_the_calibration_rows_cannot_separate_bandwidth_from_elementwise_traffic():
    """Documented in sim.calibrate: the fitted link efficiency moves with the unfitted element-wise
    scale, so it is not a measurement of NVLink."""
    low = calibrate.fit(base=sim.Costs(elementwise_traffic=0.5)).values["bandwidth"]
    high = calibrate.fit(base=sim.Costs(elementwise_traffic=1.5)).values["bandwidth"]
    assert 0.3 < low < 0.4 and 1.3 < high < 1.7
