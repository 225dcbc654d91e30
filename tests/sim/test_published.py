"""Validation rung 3: the simulator against published throughput (sim.calibration: published, validation).

The cost model is calibrated on eight rows, one per constant (sim.calibration.calibrate.CALIBRATION:
Korthikanti's 22B and 175B for the A100's GEMM efficiency and link efficiency, Narayanan's ZeRO-3
175B on 768 GPUs for ZeRO-3's collective efficiency, Shoeybi's single-V100 1.2B for the V100's GEMM
efficiency, Llama 3 405B on 8,192 H100s for the H100's, llm-foundry's MPT-7B at 32k tokens for
FlashAttention's and at 2k tokens for eager element-wise traffic, NeMo's FP8 Llama 2 7B on 8 H100s
for FP8 GEMMs) and then predicts every other published row.
The bounds below are the errors reached, not targets chosen to pass: see the comments on each.
"""

import numpy as np
import pytest

import sim
from sim.calibration import calibrate, published as pub, published_frameworks as frameworks, validation
from sim.cost.cost_model import CostModel
from sim.cost.flops import (CAUSAL, attention_core_flops, layer_elementwise_bytes, layer_flops, layer_forward_flops,
                            op_sac_share)
from sim.cost.work import Collective, Compute
from sim.step.graph import KINDS, STREAMS
from sim.step.lowering import build_graph, layer_split


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


def test_the_other_papers_numbers_follow_from_each_other():
    """What each source reports twice agrees through eq. (3): Table 2's days for 300B tokens
    (8TP/nX, Narayanan §5.1) within 4 %; MT-NLG's 60.1/50.2/44.4 s are its 126/121/113 TFLOP/s;
    BLOOM's 104.70 s is the 149.77 TFLOPs its log prints; Shoeybi's 39 TFLOP/s is "30 % of peak"
    at a DGX-2H V100's 130 TFLOP/s. ZeRO-3 rows run one micro-batch per step (batch = GPUs ×
    micro-batch) without model parallelism."""
    for run in pub.NARAYANAN_TABLE2:
        days = 8 * 300e9 * run.model().num_params / (run.gpus * run.tflops_per_gpu * 1e12) / 86400
        assert days == pytest.approx(dict(run.reported)["days_300b_tokens"], rel=0.04), run.name
        if run.family == "zero3":
            assert run.tp == run.pp == 1 and run.num_microbatches == 1 and run.zero_stage == 3
    for run in pub.MTNLG_530B + pub.BLOOM_176B:
        assert run.tflops_from_time(run.iteration_time) == pytest.approx(dict(run.reported)["tflops_per_gpu"],
                                                                         rel=0.006), run.name
    base = pub.get("shoeybi-1.2B-1gpu")
    assert base.tflops_per_gpu / (base.cluster().gpu.peak_flops / 1e12) == pytest.approx(0.30)
    assert pub.get("shoeybi-8.3B-512gpu").tflops_per_gpu * 512 == pytest.approx(15.1e3, rel=1e-3)
    assert [r.family for r in pub.ALL].count("zero3") == 6 and pub.family("offload")
    assert all(r.source and (r.family == "megatron" or r.assumptions) for r in pub.ALL)


def test_h100_rows_are_consistent_with_their_papers():
    """Each H100 row's reported MFU follows from its reported TFLOP/s or iteration time and the
    model FLOPs (sim's count) at 989 TFLOP/s: Llama 3's TFLOP/s are rounded to 10 and its MFU to
    1 % (so within 0.01), Nemotron-4's times to 10 ms and its MFU to 0.1 % (within 0.003). The
    shapes give the papers' sizes: 405B; 3.2B embedding + 12.5B other parameters; 16M tokens per
    Llama batch."""
    for run in pub.HOPPER:
        peak = run.cluster().gpu.peak_flops
        assert peak == 989e12 and run.family == "h100" and run.precision == "bf16"
        mfu = run.step_flops() / (run.gpus * run.measured_time) / peak
        assert mfu == pytest.approx(dict(run.reported)["mfu"], abs=0.01 if run.tflops_per_gpu else 0.003), run.name
        assert run.step_flops() == sim.cost.flops.model_flops_per_step(run.model(), run.global_batch)
    for run in pub.LLAMA3_405B:
        m = run.model()
        assert m.num_params == pytest.approx(405e9, rel=0.005) and m.kv_width == 1024 and m.gated
        assert run.global_batch * run.seq == 2048 * 8192 and run.pp * run.virtual == run.pipeline_layers == 128
        assert run.sim_model().layers == 128 and m.layers == 126
    for run in pub.NEMOTRON4_15B:
        m = run.model()
        embedding = 2 * m.vocab * m.hidden
        assert embedding == pytest.approx(3.2e9, rel=0.02)
        assert m.num_params - embedding == pytest.approx(12.5e9, rel=0.01)
        assert run.dp * run.micro_batch == run.global_batch and run.num_microbatches == 1


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
    assert cm.duration(Compute(312e12, 1e9)) == pytest.approx(2 + 1e9 / (cluster.gpu.hbm_bw * 0.5))
    assert cm.duration(Compute(312e12)) == pytest.approx(2)
    free = CostModel(cluster, plan, sim.Costs.compute_only())
    assert free.duration(Compute(312e12, 1e9)) == pytest.approx(2)
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
    assert sends == {Collective("p2p", 2 * 256 * 512 / 2, "pp")}  # 16-bit b·s·h / t (scatter/gather)


def test_zero3_backward_gathers_wait_for_the_previous_layer_and_only_zero3_collectives_slow_down():
    """ZeRO-3: the forward prefetches the next layer's gather during a layer's compute; the backward
    issues it when the previous layer's backward has ended (sim.step.lowering's BACKWARD_GATHER). And
    zero3_efficiency stretches the bandwidth term of ZeRO-3's DP collectives across nodes only."""
    model = sim.Model("small", layers=6, hidden=512, heads=8, vocab=1000, seq=256)
    plan = sim.Plan(zero_stage=3, dp=8, num_microbatches=1)
    cluster = sim.Cluster.preset("A100-80GB", nodes=2, gpus_per_node=4)
    r = sim.simulate(model, cluster, plan, sim.Costs(), granularity="layer")
    g = r.graph
    kinds = [KINDS[k] for k in g.kind]
    gathers = [i for i, k in enumerate(kinds) if k == "zero3_gather"]
    comps = [i for i, k in enumerate(kinds) if k in ("forward", "backward")]
    fwd = [i for i in comps if kinds[i] == "forward"]
    bwd = [i for i in comps if kinds[i] == "backward"]
    assert len(gathers) == 12  # one stage, one micro-batch: 6 layers gathered for F, then for B
    f_gathers, b_gathers = gathers[:6], gathers[6:]
    assert r.start[f_gathers[2]] < r.end[fwd[1]]                 # prefetched while layer 1 computes
    for gat, prev in zip(b_gathers[1:], bwd):
        assert r.start[gat] >= r.end[prev] - 1e-15               # on demand in the backward
    cm = CostModel(cluster, plan, sim.Costs(zero3_efficiency=0.25))
    base = CostModel(cluster, plan, sim.Costs())
    n, a, bw = base.link_params("dp")
    assert cm.duration(Collective("all_gather", 1e9, "dp")) == pytest.approx((n - 1) * a + (n - 1) / n * 1e9 / (bw * 0.25))
    one_node = sim.Cluster.preset("A100-80GB", nodes=1)  # over NVLink ZeRO-3 gathers like any collective
    assert (CostModel(one_node, plan, sim.Costs(zero3_efficiency=0.25)).duration(Collective("all_gather", 1e9, "dp"))
            == CostModel(one_node, plan, sim.Costs()).duration(Collective("all_gather", 1e9, "dp")))
    zero1 = sim.Plan(zero_stage=1, dp=8)
    assert (CostModel(cluster, zero1, sim.Costs(zero3_efficiency=0.25)).duration(Collective("all_gather", 1e9, "dp"))
            == CostModel(cluster, zero1, sim.Costs()).duration(Collective("all_gather", 1e9, "dp")))


def test_an_uneven_layer_split_puts_the_short_stages_at_the_ends():
    """BLOOM's 70 layers on 12 stages: 5, 6, …, 6, 5 (the embedding and output layer count as layers
    in Megatron-DeepSpeed's partition); every layer is simulated exactly once."""
    assert layer_split(70, 12) == [5] + [6] * 10 + [5] and layer_split(96, 8) == [12] * 8
    assert layer_split(7, 3) == [2, 3, 2] and sum(layer_split(71, 12)) == 71
    with pytest.raises(ValueError, match="at least"):
        layer_split(3, 4)
    run = pub.get("bloom-176B")
    g = build_graph(run.model(), run.plan(), granularity="layer")
    fw = STREAMS.index("compute")
    layers_f0 = [sum(1 for i in range(len(g)) if g.stage[i] == s and g.mb[i] == 0 and g.stream[i] == fw
                     and KINDS[g.kind[i]] == "forward") for s in range(run.pp)]
    assert layers_f0 == layer_split(70, 12)


# ---------------------------------------------------------------- calibration and validation


@pytest.fixture(scope="module")
def fitted():
    """The fit from round guesses (A100 GEMMs at half of peak, links at 0.8, ZeRO-3 as fast as any
    ring, one efficiency on every GPU): the solve must land on sim.Costs()'s defaults."""
    guesses = sim.Costs(efficiency=0.5, nvlink_efficiency=0.8, ib_efficiency=0.8, zero3_efficiency=1.0,
                        efficiency_by_gpu=(), attention_efficiency=0.5, eager_traffic=1.0, fp8_efficiency=0.5)
    return calibrate.fit(base=guesses)


@pytest.fixture(scope="module")
def report(fitted):
    """The held-out A100 and V100 rows (the H100 rows have their own tests below)."""
    return calibrate.validate(fitted.costs, [r for r in calibrate.held_out()
                                             if r.family not in validation.HOPPER_FAMILIES])


@pytest.fixture(scope="module")
def h100_report(fitted):
    return calibrate.validate(fitted.costs, pub.family("h100"))


def test_calibration_sees_only_the_calibration_rows(monkeypatch):
    seen = set()
    real = calibrate.predict

    def spy(run, costs, g=None):
        seen.add(run.name)
        return real(run, costs, g)

    monkeypatch.setattr(calibrate, "predict", spy)
    calibrate.fit()
    assert seen == set(calibrate.CALIBRATION) == {"korthikanti-22B-seqsel", "korthikanti-175B-seqsel",
                                                  "narayanan-t2-zero3-174.6B-768", "shoeybi-1.2B-1gpu",
                                                  "llama3-405B-8192", "mpt-7b-s32768-8", "mpt-1b-s2048-8",
                                                  "nemo-LLAMA2-7B-8"}
    assert not seen & {r.name for r in calibrate.held_out()}
    assert len(calibrate.held_out()) == len(pub.ALL) - 8 == 34 + 4 + 72 + 27


def test_calibration_rows_are_reproduced_and_the_constants_are_physical(fitted):
    """Eight rows, eight constants: the solve is exact (this only shows it converged)."""
    for name in calibrate.CALIBRATION:
        run = pub.get(name)
        assert calibrate.predict(run, fitted.costs) == pytest.approx(run.measured_time, rel=0.02)
    # exact up to the 6 significant digits the constants are kept to (so that every CPU fits the same ones)
    assert np.abs(fitted.residuals).max() < 1e-5
    assert all(float(f"{v:.6g}") == v for v in fitted.values.values())
    # GEMMs at ~70 % of 312 TFLOP/s; collectives at ~58 % of NVLink's 300 GB/s: plausible for A100s
    assert 0.6 < fitted.values["efficiency"] < 0.8
    assert 0.4 < fitted.values["bandwidth"] < 0.8
    assert fitted.costs.nvlink_efficiency == fitted.costs.ib_efficiency == fitted.values["bandwidth"]
    # ZeRO-3's rings over a DGX A100's eight 25 GB/s NICs ran at about one NIC's worth per GPU
    run = pub.get("narayanan-t2-zero3-174.6B-768")
    ring = run.cluster().ib_bw * fitted.values["bandwidth"] * fitted.values["zero3"]
    assert 0.1 < fitted.values["zero3"] < 0.35 and 15e9 < ring < 35e9
    # a V100's GEMMs (Megatron 2019) reach a smaller share of its peak than an A100's
    assert 0.3 < fitted.values["v100"] < 0.5 < fitted.values["efficiency"]
    # with FlashAttention timed apart, an H100's GEMMs reach the share of its 989 TFLOP/s an A100's reach
    # of its 312 (within 3 %), and the H200 (same die) gets the same share; FlashAttention's causal kernels
    # (2023's, on Hopper) reach about a fifth of peak; eager PyTorch moves about 3× the fused kernels' bytes
    assert abs(fitted.values["h100"] / fitted.values["efficiency"] - 1) < 0.03
    by_gpu = dict(fitted.costs.efficiency_by_gpu)
    assert by_gpu["H100-80GB"] == by_gpu["H200-141GB"] == fitted.values["h100"]
    assert 0.1 < fitted.values["attention"] < 0.3 and 2 < fitted.values["eager"] < 4.5
    # FP8 GEMMs (Transformer Engine) reach a smaller share of twice the peak than bf16 GEMMs of the peak
    assert 0.5 < fitted.values["fp8"] < fitted.values["h100"]
    # the defaults a plain sim.simulate runs at are this fit, to the 6 digits it keeps
    assert sim.Costs() == fitted.costs == calibrate.calibrate()
    c = sim.cost.costs
    assert (c.EFFICIENCY, c.LINK_EFFICIENCY, c.ZERO3_EFFICIENCY, c.V100_EFFICIENCY, c.H100_EFFICIENCY,
            c.ATTENTION_EFFICIENCY, c.EAGER_TRAFFIC, c.FP8_EFFICIENCY) == tuple(fitted.values[p] for p in calibrate.PARAMS)
    # the layer's share of peak grows with its size through the element-wise kernels
    eff = [calibrate.effective_efficiency(n, fitted.costs) for n in
           ("korthikanti-22B-seqsel", "korthikanti-175B-seqsel", "korthikanti-1T-seqsel")]
    assert eff == sorted(eff) and eff[-1] < fitted.values["efficiency"]


def test_held_out_rows_are_predicted_within_the_error_reached(report):
    """Achieved on the 34 held-out rows (python -m sim.calibration.validation): mean error 6.1 % on iteration
    time, 6.3 % on TFLOP/s per GPU (issue target ≤ 10 %). By family: Megatron TP × PP 5.4 % over
    28 rows, ZeRO-3 8.4 % over 5, offload 14.2 % over its one row — above the 10 % aim: the V100
    GEMM efficiency comes from Shoeybi's 1.2B (hidden 1536, 96-wide heads) and ZeRO-Offload's 10B
    (hidden 4096) has larger, more efficient GEMMs, which one efficiency per GPU cannot follow.
    Worst rows: MT-NLG −18 to −21 % (the simulator is faster: DeepSpeed's pipeline engine sends
    every TP rank's full activation, not Megatron's scatter/gather, and is not modelled),
    Shoeybi's 8.3B on 512 GPUs +18 % (its 64-way gradient all-reduce cost almost nothing in the
    paper's numbers), ZeRO-3 175B on 1536 GPUs −14 %."""
    assert report.mape_time <= 0.065 and report.mape_tflops <= 0.07
    fam = {f: validation.family_mape(report, f) for f in pub.FAMILIES}
    assert fam["megatron"] <= 0.06
    assert fam["zero3"] <= 0.09
    assert fam["offload"] <= 0.15
    errs = {r.name: abs(r.time_error) for r in report.rows}
    # per row: Megatron-LM's own papers within 10 %; ZeRO-3 within 15 %; everything within 22 %
    assert max(e for n, e in errs.items() if n.startswith(("korthikanti", "narayanan-1", "narayanan-3",
                                                           "narayanan-7", "narayanan-t2-ptdp"))) <= 0.10
    assert max(e for n, e in errs.items() if pub.get(n).family == "zero3") <= 0.15
    assert max(errs.values()) <= 0.22
    assert len(report.rows) == 34 and not {r.name for r in report.rows} & set(calibrate.CALIBRATION)
    for r in report.rows:  # the TFLOP/s error is the time error, inverted
        assert (1 + r.tflops_error) * (1 + r.time_error) == pytest.approx(1)
    assert "MAPE over 34 rows" in report.table()


def test_h100_held_out_rows_are_predicted_within_the_error_reached(h100_report):
    """Achieved (python -m sim.calibration.validation, H100 section), the H100 GEMM efficiency fitted on
    Llama 3 405B on 8,192 GPUs: Llama 3 on 16,384 GPUs +1.8 % on time (its smaller batch per DP group, a
    larger pipeline bubble, as the paper says), Nemotron-4 15B +13.3 %, +11.9 %, +1.9 % (the simulator
    slower: those runs' 0.57 s at DP 96 and 0.58 s at DP 192 beat one GEMM efficiency fitted on a
    405B; at DP 288 it agrees); held-out MAPE 7.2 % on time over 4 rows. Bounds: the errors reached,
    rounded up."""
    errs = {r.name: r.time_error for r in h100_report.rows}
    assert errs["llama3-405B-8192"] == pytest.approx(0, abs=1e-5)               # the fitted row
    assert abs(errs["llama3-405B-16384"]) <= 0.03
    assert all(abs(e) <= 0.14 for n, e in errs.items() if n.startswith("nemotron4"))
    held = calibrate.Validation(h100_report.costs, [r for r in h100_report.rows if r.name not in calibrate.CALIBRATION])
    assert len(held.rows) == 4 and held.mape_time <= 0.08 and held.mape_tflops <= 0.07
    table = validation.h100_table(calibrate.fit())
    assert "llama3-405B-8192 (fit)" in table and "mpt-1b-s2048-8 (fit)" in table
    assert table.count("held-out MAPE over 103 rows") == 2


def test_one_gemm_efficiency_serves_a100_and_h100_once_flash_attention_is_timed_apart(fitted):
    """Timed as GEMMs of the full s² (the simulator's count before FlashAttention's causal kernels
    had their own rate), Llama 3 405B needed an H100 GEMM share 8 % below the A100's: the attention
    core's time hid in the GEMM efficiency. With the causal kernels at their own efficiency, the
    A100's share predicts both Llama 3 rows within 2 % (−1.3 %, +0.5 %)."""
    a100 = calibrate.with_params(fitted.costs, {"h100": fitted.values["efficiency"]})
    for name in ("llama3-405B-8192", "llama3-405B-16384"):
        run = pub.get(name)
        assert abs(calibrate.predict(run, a100) / run.measured_time - 1) <= 0.02, name
    as_gemms = fitted.costs.override(attention_efficiency=fitted.values["h100"])
    run = pub.get("llama3-405B-8192")
    # the same GEMM share, the attention core at half the FLOPs and the GEMMs' rate: 7.8 % too fast
    assert calibrate.predict(run, as_gemms) / run.measured_time - 1 < -0.06


def test_a_plain_simulate_runs_at_the_fitted_constants():
    """sim.simulate(model, cluster, plan) without costs runs at Costs()'s defaults, which are the fit:
    on the five Llama 3 / Nemotron-4 rows −0.0 (fitted on), +1.8, +13.3, +11.9, +1.9 % on time (MAPE
    5.8 %); bounds rounded up."""
    for run in pub.HOPPER + pub.FRAMEWORKS_H100[:3]:
        plain = sim.simulate(run.sim_model(), run.cluster(), run.plan(), granularity=calibrate.granularity(run))
        assert plain.step_time == calibrate.predict(run, sim.Costs())
    report = calibrate.validate(sim.Costs(), pub.HOPPER)
    assert max(abs(r.time_error) for r in report.rows) <= 0.14 and report.mape_time <= 0.065


def test_both_halves_of_the_zero3_fix_are_needed(fitted):
    """Before: ZeRO-3 predicted 1.4–4.5× too fast (bandwidth as for any ring, gathers prefetched).
    The bandwidth constant alone (refitted on the same row) leaves the compute-bound rows (384 and
    640 GPUs) 20–26 % too fast: prefetched gathers hide too much behind the backward; on-demand
    backward gathers alone leave the communication-bound rows 1.7–3× too fast."""
    rows = [r for r in pub.NARAYANAN_TABLE2 if r.family == "zero3"]
    old = fitted.costs.override(zero3_efficiency=1.0)
    ratio = [r.measured_time / calibrate.predict(r, old) for r in rows]  # on-demand gathers, fast rings
    assert min(ratio[1:3] + ratio[4:]) > 1.7
    saved = sim.step.lowering.BACKWARD_GATHER
    sim.step.lowering.BACKWARD_GATHER = "prefetch"
    try:
        refit = calibrate.fit(calibrate.CALIBRATION, base=fitted.costs, params=("zero3",)).costs
        err = {r.gpus: calibrate.predict(r, refit) / r.measured_time - 1 for r in rows}
    finally:
        sim.step.lowering.BACKWARD_GATHER = saved
    assert err[384] < -0.15 and err[640] < -0.2


def test_predict_is_simulate_and_deterministic(fitted):
    run = pub.get("narayanan-39.1B")
    r = sim.simulate(run.model(), run.cluster(), run.plan(), fitted.costs, granularity=calibrate.granularity(run))
    assert calibrate.predict(run, fitted.costs) == r.step_time
    assert calibrate.fit().values == fitted.values


def test_the_calibration_rows_cannot_separate_bandwidth_from_elementwise_traffic():
    """Documented in sim.calibration.calibrate: the fitted link efficiency moves with the unfitted element-wise
    scale, so it is not a measurement of NVLink."""
    low = calibrate.fit(base=sim.Costs(elementwise_traffic=0.5)).values["bandwidth"]
    high = calibrate.fit(base=sim.Costs(elementwise_traffic=1.5)).values["bandwidth"]
    assert 0.3 < low < 0.4 and 1.3 < high < 1.7


# ---------------------------------------------------------------- the frameworks' H100 tables


def test_framework_rows_are_consistent_with_their_tables():
    """llm-foundry's rows: the MPT shapes give the table's NumParams exactly (learned positions, biases,
    tied embedding: so the shape we simulate is the one measured), and its MFU column follows from
    the step time through its own count (6·NumParams + 12·l·h·s per token at 989 TFLOP/s) within
    0.0005 (T/s/GPU rounded to a token, MFU to 0.01 %). Every row states its source and assumptions;
    torchtitan's step is 2 sequences of 8192 tokens per GPU."""
    assert len(frameworks.FOUNDRY_H100) == 70 and len(frameworks.TORCHTITAN_H100) == 4
    for run in frameworks.FOUNDRY_H100:
        rep = dict(run.reported)
        assert run.model().num_params == rep["num_params"], run.name
        count = 6 * rep["num_params"] * run.seq + 12 * run.layers * run.hidden * run.seq ** 2
        mfu = count * run.global_batch / (run.gpus * run.measured_time * 989e12)
        assert mfu == pytest.approx(rep["mfu"], abs=5e-4), run.name
        assert run.tp == run.pp == 1 and run.dp == run.gpus and run.framework == "fsdp2"
    for run in frameworks.TORCHTITAN_H100:
        assert run.global_batch * run.seq / (run.gpus * run.measured_time) == dict(run.reported)["tokens_per_gpu_s"]
        assert run.model().num_params == pytest.approx(8.03e9, rel=0.005)
    assert all(r.source and r.assumptions and r.family in ("fsdp", "fp8") for r in frameworks.FRAMEWORKS_H100)
    assert len(frameworks.NOT_EXPRESSIBLE) == 3 and all(why for _, why in frameworks.NOT_EXPRESSIBLE)


def test_fp8_rows_are_consistent_with_their_tables():
    """NeMo's Model TFLOP/s/GPU column follows from its Tokens/s/GPU and the shapes we give the models
    (sim's model-FLOPs count: GPT-3's learned positions and 50304 vocabulary, Llama 2's SwiGLU and
    grouped-query 70B, Nemotron's squared-ReLU MLP) within 1 TFLOP/s (the column's rounding); the
    llm-foundry FP8 rows have their table's NumParams; every FP8 row runs its GEMMs in FP8 on H100s."""
    assert len(frameworks.NEMO_FP8) == 10 and len(frameworks.FP8_H100) == 28
    for run in frameworks.NEMO_FP8 + frameworks.NEMO_CP:
        rep = dict(run.reported)
        assert run.tflops_from_time(run.measured_time) == pytest.approx(rep["model_tflops_per_gpu"], abs=1.0), run.name
    for run in frameworks.FOUNDRY_FP8:
        assert run.model().num_params == dict(run.reported)["num_params"], run.name
    for run in frameworks.FP8_H100:
        assert run.fp8 and run.plan().fp8 and run.family == "fp8" and run.gpu in ("H100-80GB", "H200-141GB")
    with pytest.raises(ValueError, match="FP8 tensor cores"):
        CostModel(sim.Cluster.preset("A100-80GB"), sim.Plan(fp8=True), sim.Costs())
    cm = CostModel(sim.Cluster.preset("H100-80GB"), sim.Plan(fp8=True), sim.Costs(fp8_efficiency=0.5))
    assert cm.duration(Compute(989e12)) == pytest.approx(1.0)


def test_flash_attention_is_timed_as_its_causal_kernels_and_counted_unmasked():
    """'flash' takes the attention core out of the GEMMs: forward CAUSAL × 4bs²h, backward 2.5× that
    (3.5× with full recompute), at Costs.attention_efficiency; model FLOPs (MFU) keep 4bs²h; 'eager'
    is unchanged (the A100 rows' count)."""
    model = sim.Model("m", layers=2, hidden=1024, heads=8, vocab=1000, seq=4096)
    core = attention_core_flops(model, 2)
    fwd = layer_forward_flops(model, 2)
    f = layer_flops(model, 2, "none", "flash")
    assert f["forward"] == (fwd - core, CAUSAL * core) and f["backward"] == (2 * (fwd - core), 2.5 * CAUSAL * core)
    assert layer_flops(model, 2, "full", "flash")["backward"] == (3 * (fwd - core), 3.5 * CAUSAL * core)
    assert layer_flops(model, 2, "none", "eager")["forward"] == (fwd, 0.0)
    # torchtitan's per-op checkpointing recomputes k, o and w3 of Llama 3 8B's block: 36.5 % of its GEMMs
    llama = frameworks.TORCHTITAN_H100[0].model()
    share = op_sac_share(llama)
    assert share == pytest.approx((4096 * 1024 + 4096**2 + 4096 * 14336)
                                  / (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336))
    g = layer_flops(llama, 1, "none", "flash", share)["backward"][0]
    assert g == pytest.approx((2 + share) * layer_flops(llama, 1, "none", "flash")["forward"][0])
    with pytest.raises(ValueError, match="recompute_gemms"):
        sim.Plan(recompute_gemms=1.5)
    cluster = sim.Cluster.preset("H100-80GB")
    cm = CostModel(cluster, sim.Plan(), sim.Costs(attention_efficiency=0.25))
    assert cm.duration(Compute(0.0, 0.0, 989e12)) == pytest.approx(4.0)


def test_eager_kernels_move_more_bytes_and_fsdp_gathers_run_at_link_speed():
    """kernels='eager' scales the element-wise bytes by Costs.eager_traffic; ZeRO-3's DeepSpeed-2021
    slowdown across nodes (zero3_efficiency) is DeepSpeed's: an FSDP2 plan's gathers do not get it."""
    cluster = sim.Cluster.preset("H100-80GB", nodes=2)
    costs = sim.Costs(eager_traffic=3.0, hbm_efficiency=1.0)
    fused = CostModel(cluster, sim.Plan(), costs).duration(Compute(0.0, 3.35e12))
    assert fused == pytest.approx(1.0)
    assert CostModel(cluster, sim.Plan(kernels="eager"), costs).duration(Compute(0.0, 3.35e12)) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="kernels"):
        sim.Plan(kernels="compiled")
    with pytest.raises(ValueError, match="backward_prefetch is an FSDP2 setting"):
        sim.Plan(zero_stage=3, dp=8, backward_prefetch=False)
    ds, fsdp = sim.Plan(zero_stage=3, dp=16), sim.Plan(zero_stage=3, dp=16, framework="fsdp2")
    gather = Collective("all_gather", 1e9, "dp")
    c = sim.Costs(zero3_efficiency=0.25)
    assert CostModel(cluster, ds, c).duration(gather) > 3 * CostModel(cluster, fsdp, c).duration(gather)
    assert CostModel(cluster, fsdp, c).duration(gather) == CostModel(cluster, fsdp, sim.Costs()).duration(gather)


def test_held_out_h100_rows_meet_the_issue_targets_with_the_default_constants():
    """Issue 33's targets on every H100/H200 row not fitted on (103 held-out rows: llm-foundry's and
    torchtitan's bf16 and FP8 tables with torchtitan's context-parallel one and Trainy's H200 runs,
    NeMo's FP8 table, Llama 3 405B on 16,384 GPUs, Nemotron-4 15B), with sim.Costs()'s defaults: mean
    step-time error ≤ 8 %, max ≤ 20 %. Reached: 7.2 % mean; worst torchtitan's FSDP2 + Float8 on 128
    GPUs −18.2 % (FSDP2's prefetched gathers hide more than the run did), MPT-70B on 32 GPUs +17.4 %,
    MPT-30B at 8k tokens −15.4 %, torchtitan's CP 2 row +15.4 %, NeMo's Nemotron-22B −15.2 %. By
    family: FSDP 6.8 % over 72 rows, FP8 8.3 % over 27, Llama 3 / Nemotron-4 7.2 % over 4."""
    rows = [r for r in calibrate.held_out() if r.family in validation.HOPPER_FAMILIES]
    report = calibrate.validate(sim.Costs(), rows)
    assert len(report.rows) == 103 and not {r.name for r in report.rows} & set(calibrate.CALIBRATION)
    assert report.mape_time <= 0.075
    assert max(abs(r.time_error) for r in report.rows) <= 0.19
    fam = {f: validation.family_mape(report, f) for f in validation.HOPPER_FAMILIES}
    assert fam["fsdp"] <= 0.07 and fam["fp8"] <= 0.085 and fam["h100"] <= 0.08


def test_fsdp_backward_post_gathers_wait_for_the_previous_unit():
    """backward_prefetch=False (FSDP1's BACKWARD_POST, Composer's default, which llm-foundry's rows ran):
    each backward all-gather starts when the previous unit's backward has ended; FSDP2's default
    prefetches it during that backward."""
    model = sim.Model("small", layers=6, hidden=512, heads=8, vocab=1000, seq=256)
    cluster = sim.Cluster.preset("H100-80GB", nodes=2, gpus_per_node=4)
    for prefetch in (True, False):
        plan = sim.Plan(zero_stage=3, dp=8, framework="fsdp2", backward_prefetch=prefetch, attention="flash")
        r = sim.simulate(model, cluster, plan, sim.Costs(), granularity="layer")
        kinds = [KINDS[k] for k in r.graph.kind]
        gathers = [i for i, k in enumerate(kinds) if k == "zero3_gather"][6:]  # the backward's
        bwd = [i for i, k in enumerate(kinds) if k == "backward"]
        waits = [r.start[gat] >= r.end[prev] - 1e-15 for gat, prev in zip(gathers[1:], bwd)]
        assert all(waits) if not prefetch else not waits[0]  # prefetched: issued while unit 0's backward runs
