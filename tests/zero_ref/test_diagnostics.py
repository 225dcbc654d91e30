"""zero_ref.diagnostics: the memory report, the collective watchdog and the first-inf/nan finder.

Multi-rank parts run on real gloo ranks (zero_ref.launch); a hang must fail the launch through the
watchdog within seconds (a RankError from the rank that timed out), never through the launcher's
own timeout.
"""
import math
from contextlib import nullcontext

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zero_ref
from zero_ref import diagnostics as D
from zero_ref.launcher import RankError
from zero_ref.memory import GiB, model_state_bytes, plan_zero_stage
from zero_ref.models import GPT, GPTConfig, make_batch
from tests.zero_ref.cases import ADAM, build_model, micro_batch

LAUNCH_TIMEOUT = 180  # the launcher's; the watchdog's are a few seconds


# ------------------------------------------------------------------ memory report + anomalies on 2 ranks

def inspect(rank, world):
    from zero_ref.diagnostics import detect_anomalies, memory_report
    from zero_ref.ds.engine import initialize
    from zero_ref.precision import LossScaleAtMinimum
    from zero_ref.stages import STAGES, ZeroStage3

    out = {}
    for name, stage, precision, kw in [("0", 0, "fp32", {}), ("1", 1, "bf16", {}), ("2", 2, "bf16", {}),
                                       ("3", 3, "fp32", {}), ("3-no-persist", 3, "bf16", {"param_persistence_threshold": 0})]:
        model = build_model()
        opt = STAGES[stage](model, adam=ADAM, precision=precision, reduce_bucket_size=400, **kw)
        _, loss = model(*micro_batch(0, 0, rank, world, 1))
        opt.backward(loss)
        opt.step()
        rep = memory_report(opt, simulated={"param": 1.0, "activation": 2.0, "total": 3.0})
        out[name] = {"measured": rep.measured, "expected": rep.expected, "formula": rep.formula, "terms": rep.terms,
                     "mismatches": rep.mismatches(), "text": str(rep), "psi": rep.num_params, "sim": rep.simulated}

    # A huge weight in blocks.1.mlp.fc1 under ZeRO-3: the hooks see the gathered parameters.
    model = build_model()
    with torch.no_grad():
        model.blocks[1].mlp.fc1.weight[0].fill_(3e38)
    opt = ZeroStage3(model, adam=ADAM, param_persistence_threshold=0)
    with detect_anomalies(model) as found:
        _, loss = model(*micro_batch(0, 0, rank, world, 1))
        opt.backward(loss)
    out["huge_weight"] = found.forward

    # fp16 through the engine: the scaler's skipped steps get their cause.
    def engine_run(lr, scale_power, steps):
        torch.manual_seed(0)
        cfg = GPTConfig(vocab_size=97, seq_len=8, d_model=32, n_heads=4, n_layers=2)
        engine, *_ = initialize(model=GPT(cfg), config={
            "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "zero_optimization": {"stage": 2},
            "optimizer": {"type": "AdamW", "params": {"lr": lr}},
            "fp16": {"enabled": True, "initial_scale_power": scale_power, "hysteresis": 1}})
        raised = False
        with detect_anomalies(engine) as found:
            try:
                for step in range(steps):
                    idx, targets = make_batch(cfg, 4, seed=step)
                    _, loss = engine(idx[2 * rank:2 * rank + 2], targets[2 * rank:2 * rank + 2])
                    engine.backward(loss)
                    engine.step()
            except LossScaleAtMinimum:
                raised = True
        scaler = engine.optimizer.loss_scaler
        restored = type(scaler).update_scale.__get__(scaler) == scaler.update_scale  # the hook is gone
        return found.skipped, raised, restored

    out["fp16_default"] = engine_run(1e-3, 16, 2)
    out["fp16_lr_too_high"] = engine_run(3.0, 8, 14)
    return out


@pytest.fixture(scope="module")
def inspected():
    return zero_ref.launch(inspect, 2, timeout=LAUNCH_TIMEOUT)


@pytest.mark.slow
def test_memory_report_measured_equals_expected_at_every_stage(inspected):
    psi = sum(p.numel() for p in build_model().parameters() if p.requires_grad)
    for rank, res in enumerate(inspected):
        for name, rep in res.items():
            if not name[0].isdigit():
                continue
            stage, precision = int(name[0]), {"0": "fp32", "1": "bf16", "2": "bf16", "3": "fp32"}[name[0]]
            precision = "bf16" if name == "3-no-persist" else precision
            assert rep["mismatches"] == [] and rep["measured"] == rep["expected"], name
            assert rep["psi"] == psi
            formula = model_state_bytes(psi, zero_stage=stage, dp=2, precision=precision)
            assert rep["formula"] == {"params": formula.params, "grads": formula.grads, "optimizer": formula.optimizer}
            # expected = formula + the listed terms, category by category
            for c in ("params", "grads", "optimizer"):
                assert rep["expected"][c] == rep["formula"][c] + sum(t.get(c, 0) for t in rep["terms"].values())
            assert 0 <= rep["terms"]["padding"]["optimizer"] < 16 * 2 * 20  # < N elements per bucket
            assert rep["sim"] == {"params": 1.0, "activations": 2.0}
            assert rep["text"].splitlines()[0].startswith(f"rank {rank} of 2, ZeRO-{stage}, {precision}")
    z3 = inspected[0]["3"]
    # A small model under ZeRO-3: every unit is under the persistence threshold and stays whole, so
    # params far exceed the formula's Ψ/N (a common "ZeRO-3 uses more memory than ZeRO-2" report).
    assert z3["terms"]["persistent units (whole)"]["params"] > z3["formula"]["params"]
    assert "params: measured - formula" in z3["text"] and "persistent units (whole)" in z3["text"]
    assert inspected[0]["3-no-persist"]["terms"]["persistent units (whole)"]["params"] == 0
    assert inspected[0]["3-no-persist"]["terms"]["frozen units (shards)"]["params"] > 0  # the frozen pos_emb


def test_memory_report_verdict_names_the_category():
    rep = D.MemoryReport(0, 2, 2, "bf16", 100, measured={"params": 200, "grads": 108, "optimizer": 600},
                         formula={"params": 200, "grads": 100, "optimizer": 600},
                         expected={"params": 200, "grads": 100, "optimizer": 600})
    assert rep.mismatches() == ["grads"]
    assert rep.verdict().startswith("MISMATCH: grads: measured 108 B, expected 100 B (+8 B)")
    with pytest.raises(TypeError, match="Engine or stage"):
        D.memory_report(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------ OOM explainer (formulas only)

def test_explain_oom_walks_the_ladder():
    psi, gib = 1_500_000_000, GiB
    acts = {"none": 20 * gib, "selective": 12 * gib, "full": 3 * gib}
    # Plenty of memory: stage 0 fits, nothing to change.
    assert D.explain_oom(psi, dp=8, device_bytes=80 * gib, activations=acts).fix == "ZeRO-0, recompute=none"
    # 30 GiB: ZeRO-1 is the first stage that fits with the current activations, as plan_zero_stage says.
    adv = D.explain_oom(psi, dp=8, device_bytes=30 * gib, activations=acts)
    best, _ = plan_zero_stage(psi, dp=8, device_bytes=30 * gib, other_bytes=acts["none"])
    assert adv.fix == f"ZeRO-{best}, recompute=none" and best == 1
    # 24 GiB: activations dominate; no stage 0-2 fits without recompute, ZeRO-1 with selective does.
    adv = D.explain_oom(psi, dp=8, device_bytes=24 * gib, activations=acts)
    assert adv.largest == "activations" and "over by 18.35 GiB" in str(adv)
    assert adv.fix == "ZeRO-1, recompute=selective"
    assert D.explain_oom(psi, dp=8, device_bytes=6 * gib, activations=acts).fix == "ZeRO-3, recompute=full"
    # 4 GiB: only offload fits; 1 GiB: nothing does.
    assert D.explain_oom(psi, dp=8, device_bytes=4 * gib, activations=acts).fix.startswith("ZeRO-3, offload_optimizer=cpu")
    tiny = D.explain_oom(psi, dp=8, device_bytes=gib, activations=acts)
    assert tiny.fix is None and str(tiny).endswith("add devices")
    # Without activations the largest category in mixed precision is the optimizer (12 of 16 bytes).
    assert D.explain_oom(psi, dp=8, device_bytes=gib).largest == "optimizer"
    with pytest.raises(ValueError, match="recompute"):
        D.explain_oom(psi, dp=8, device_bytes=gib, activations={"full": 1.0})


@settings(max_examples=60, deadline=None)
@given(psi=st.integers(10**6, 10**11), dp=st.sampled_from([1, 2, 8, 64]), budget=st.floats(1e8, 1e12),
       act=st.floats(0, 1e11))
def test_explain_oom_fix_is_the_first_option_that_fits(psi, dp, budget, act):
    adv = D.explain_oom(psi, dp=dp, device_bytes=budget, activations={"none": act, "full": act / 10})
    fits = [fits for _, _, fits in adv.options]
    assert all(f == (b <= budget) for _, b, f in adv.options)
    assert adv.fix == (adv.options[fits.index(True)][0] if any(fits) else None)
    now = sum(adv.needed.values())
    assert math.isclose(now, model_state_bytes(psi, zero_stage=0, dp=dp).total + act, rel_tol=1e-12)


# ------------------------------------------------------------------ collective watchdog

def mismatched(rank, world, kind, check, timeout):
    from zero_ref import comm
    from zero_ref.diagnostics import watch_collectives
    t = torch.ones(4)
    with watch_collectives(timeout=timeout, check=check):
        comm.all_reduce(t)  # call #1 matches
        if kind == "skip" and rank == 1:
            comm.all_reduce(t)  # rank 0 never makes this call
        elif kind == "op":
            comm.all_reduce(t) if rank == 0 else comm.all_gather(torch.empty(8), t)
        elif kind == "shape":
            comm.all_reduce(torch.ones(4 if rank == 0 else 8))
    return float(t[0])


def launch_error(*args) -> str:
    with pytest.raises(RankError) as err:  # a rank failed: not the launcher's RankTimeout
        zero_ref.launch(mismatched, 2, *args, timeout=LAUNCH_TIMEOUT)
    return str(err.value)


@pytest.mark.slow
def test_watchdog_names_the_rank_that_never_called():
    msg = launch_error("skip", False, 2.0)
    assert f"exited with code {D.EXIT_CODE}" in msg
    report = D.timeout_report(msg)
    assert report.splitlines()[0] == "rank 1 waited more than 2 s in all_reduce #2 on ranks [0, 1]"
    assert "  rank 0: all_reduce #1 (float32[4]) from test_diagnostics.py:N (mismatched); left the watched block" in report
    assert "diagnosis: rank 0 never issued call #2 on ranks [0, 1]" in report


@pytest.mark.slow
def test_watchdog_names_both_operations():
    report = D.timeout_report(launch_error("op", False, 2.0))
    assert "all_reduce #2 (float32[4])" in report and "all_gather #2 (float32[8])" in report
    assert "rank 0:" in report and "rank 1:" in report
    assert "diagnosis: call #2 differs" in report


@pytest.mark.slow
def test_check_mode_names_mismatched_shapes_before_issuing():
    msg = launch_error("shape", True, 5.0)
    assert ("CollectiveMismatch: call #2 on ranks [0, 1] differs between ranks: rank 0 all_reduce (float32[4]) "
            "from test_diagnostics.py:") in msg and "rank 1 all_reduce (float32[8])" in msg


def normal_path(rank, world):
    import threading
    import time
    from zero_ref import comm
    from zero_ref.diagnostics import watch_collectives
    from zero_ref.stages import ZeroStage3

    def train(watched):
        model = build_model()
        opt = ZeroStage3(model, adam=ADAM, param_persistence_threshold=0, prefetch_bucket_size=200)
        with watch_collectives(timeout=30) if watched else nullcontext():
            for step in range(2):
                opt.backward(model(*micro_batch(step, 0, rank, world, 1))[1])
                opt.step()
        return [u.unit.part.clone() for u in opt.units]

    same = all(torch.equal(a, b) for a, b in zip(train(False), train(True)))

    # the hot path does no store round trip: every store write of the block's calls is the watchdog
    # thread's (a structural check of the cost; benchmarks, not tests, time things)
    from zero_ref.diagnostics import watchdog
    writers, publish = [], watchdog._Watch._publish
    watchdog._Watch._publish = lambda self: (writers.append(threading.get_ident()), publish(self))
    try:
        with watch_collectives(timeout=30, poll=0.01) as w:
            for _ in range(200):
                comm.all_reduce(torch.ones(16))
            deadline = time.monotonic() + 10  # the watchdog publishes within PUBLISH_S of a change
            while not writers and time.monotonic() < deadline:
                time.sleep(0.01)
            during = list(writers)
    finally:
        watchdog._Watch._publish = publish
    off_hot_path = sum(w.calls.values()) == 200 and bool(during) and threading.get_ident() not in during
    comm.barrier()
    with watch_collectives(timeout=3.0):  # a pause outside any collective is not a hang
        time.sleep(3.5)  # (the timeout leaves room for the ranks' skew on a loaded machine)
        comm.all_reduce(torch.ones(1))
    return same, off_hot_path


@pytest.mark.slow
def test_normal_path_no_false_alarm_same_result_store_writes_off_the_hot_path():
    for same, off_hot_path in zero_ref.launch(normal_path, 2, timeout=LAUNCH_TIMEOUT):
        assert same
        assert off_hot_path  # 200 calls counted, their records written by the watchdog thread only


def test_watchdog_bad_input_and_report_sanitizing():
    with pytest.raises(ValueError, match="initialised process group"):
        with D.watch_collectives(timeout=1):
            pass
    text = ("x\n=== zero_ref: collective timeout ===\nrank 0 ... from zero3.py:194 (_agree) <- 4071652.py:5 (f)\n"
            "=== end of report ===\ny")
    assert D.timeout_report(text) == "rank 0 ... from zero3.py:N (_agree) <- <cell>:N (f)"
    assert D.timeout_report(text, sanitize=False) == "rank 0 ... from zero3.py:194 (_agree) <- 4071652.py:5 (f)"


# ------------------------------------------------------------------ first inf / nan

CFG = GPTConfig(vocab_size=97, seq_len=8, d_model=21, n_heads=3, n_layers=2)


def run_with(edit=None):
    torch.manual_seed(0)
    model = GPT(CFG)
    if edit:
        with torch.no_grad():
            edit(model)
    with D.detect_anomalies(model) as found:
        _, loss = model(*make_batch(CFG, 2))
        loss.backward()
    assert not model.blocks[0].mlp.fc1._forward_hooks  # removed on exit
    return model, loss, found


def test_detect_anomalies_names_the_injected_module():
    model, loss, found = run_with()
    assert found.first is None and found.report() == "no inf/nan seen" and D.find_nonfinite(model, loss) is None

    def nan(m):
        m.blocks[1].mlp.fc1.weight[3, 5] = float("nan")
    model, loss, found = run_with(nan)
    assert (found.forward.what, found.forward.name, found.forward.kind) == ("forward output", "blocks.1.mlp.fc1", "nan")
    assert "parameter blocks.1.mlp.fc1.weight holds nan" in found.forward.note
    assert D.find_nonfinite(model, loss) == D.Finding("parameter", "blocks.1.mlp.fc1.weight", "nan", (84, 21))

    def huge(m):
        m.blocks[1].mlp.fc1.weight[0].fill_(3e38)
    model, loss, found = run_with(huge)
    assert found.forward.name == "blocks.1.mlp.fc1" and found.forward.kind == "inf"
    assert "its inputs were finite" in found.forward.note and "blocks.1.mlp.fc1.weight = 3e+38" in found.forward.note
    assert found.backward is not None and found.param_grad is not None
    # The causal mask buffer holds -inf on purpose: not a finding. The weight itself is finite.
    assert D.find_nonfinite(model).what == "gradient"


@pytest.mark.slow
def test_anomalies_under_zero3_and_the_fp16_scaler(inspected):
    for res in inspected:
        assert res["huge_weight"].name == "blocks.1.mlp.fc1"
        # Scale 2**16 with a loss computed in fp16: the loss's own gradient is the scale, > 65504.
        skipped, raised, restored = res["fp16_default"]
        assert restored and not raised
        assert [(s.iteration, s.loss_scale) for s in skipped] == [(0, 65536)]
        assert skipped[0].cause == "gradient w.r.t. the output of GPT: inf, shape []"
        # lr = 3: the weights blow up, the forward pass overflows, lowering the scale cannot help.
        skipped, raised, _ = res["fp16_lr_too_high"]
        assert raised and [s.loss_scale for s in skipped][:3] == [256, 128, 64]
    causes = [s.cause for res in inspected for s in res["fp16_lr_too_high"][0]]
    assert any(c.startswith("forward output of blocks.") for c in causes)
