"""What chapter 30's capstone stands on: a plan written as a DeepSpeed config, and that config run for real.

``sim.Plan.to_deepspeed`` must be the inverse of ``Plan.from_deepspeed`` on every plan (property
test), write configs zero_ref.config accepts, and refuse what a DeepSpeed config cannot hold.
``zero_ref.profiling.trial.run_config`` trains a config through ``zero_ref.initialize`` on two gloo ranks; the
bytes it reports per category must equal zero_ref.memory's formula and its collectives those the
simulator books for the same plan, and its result must drive the locally fitted simulator.
"""
import pytest
from hypothesis import given, settings, strategies as st

import sim
import sim.calibration.fit_local as fl
from sim.step.memory_timeline import static_bytes
from zero_ref import config as ds_config
from zero_ref.memory import model_state_bytes

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

# (optimizer, parameters) offload by stage, as DeepSpeed allows them; zero_ref keeps parameters on NVMe only
# together with the optimizer (one store), so parameters on NVMe alone are left out
OFFLOADS = {0: [("none", "none")], 1: [("none", "none"), ("cpu", "none")], 2: [("none", "none"), ("cpu", "none")],
            3: [("none", "none"), ("cpu", "none"), ("cpu", "cpu"), ("nvme", "none"), ("nvme", "cpu"), ("nvme", "nvme")]}


@st.composite
def plans(draw):
    stage = draw(st.integers(0, 3))
    off_opt, off_par = draw(st.sampled_from(OFFLOADS[stage]))
    tp, pp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    return sim.Plan(zero_stage=stage, tp=tp, pp=pp, dp=draw(st.integers(1, 64)),
                    micro_batch_size=draw(st.integers(1, 8)), num_microbatches=draw(st.integers(1, 64)),
                    recompute=draw(st.sampled_from(["none", "selective", "full"])),
                    sequence_parallel=tp > 1 and draw(st.booleans()),
                    precision=draw(st.sampled_from(["bf16", "fp16", "fp32"])), offload_optimizer=off_opt,
                    offload_param=off_par, overlap_comm=draw(st.booleans()),
                    reduce_bucket_size=draw(st.integers(1, 10**9)), allgather_bucket_size=draw(st.integers(1, 10**9)),
                    gradient_clipping=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])))


@settings(max_examples=200, deadline=None)
@given(plans())
def test_to_deepspeed_is_the_inverse_of_from_deepspeed(plan):
    config = plan.to_deepspeed(optimizer={"type": "AdamW", "params": {"lr": 1e-3}})
    model_side = dict(recompute=plan.recompute, sequence_parallel=plan.sequence_parallel)
    assert sim.Plan.from_deepspeed(config, plan.world_size, plan.tp, plan.pp, **model_side) == plan
    assert ds_config.problems(config, dp=plan.dp) == []
    # the config's model states per tier (zero_ref.config) are the simulator's, for the rank's share of the model
    placement = ds_config.model_state_placement(ds_config.parse(config, dp=plan.dp), 7_000_000)
    static = static_bytes(7_000_000, plan)
    for tier, states in placement.items():
        assert states.total / (plan.tp * plan.pp) == pytest.approx(sum(static[tier].values()), rel=1e-12, abs=1e-6)


def test_to_deepspeed_writes_the_keys_deepspeed_reads():
    plan = sim.Plan(zero_stage=3, dp=8, num_microbatches=4, precision="mixed", offload_optimizer="nvme",
                    offload_param="cpu", overlap_comm=False)
    config = plan.to_deepspeed(nvme_path="/scratch")
    assert config["train_batch_size"] == 32 and config["fp16"] == {"enabled": True} and "bf16" not in config
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "nvme", "nvme_path": "/scratch"}
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert config["zero_optimization"]["overlap_comm"] is False  # DeepSpeed's default at stage 3 is True
    assert "bf16" not in sim.Plan(precision="fp32").to_deepspeed() and "fp16" not in sim.Plan(precision="fp32").to_deepspeed()


def test_to_deepspeed_refuses_what_a_config_cannot_hold():
    with pytest.raises(ValueError, match="Plan.precision 'bf16_fp32_grads'"):
        sim.Plan(precision="bf16_fp32_grads").to_deepspeed()
    with pytest.raises(ValueError, match="train_batch_size, zero_optimization come from the plan"):
        sim.Plan().to_deepspeed(zero_optimization={"stage": 3}, train_batch_size=8)
    with pytest.raises(ValueError, match="fp16"):
        sim.Plan().to_deepspeed(fp16={"enabled": True})


def test_run_config_errors_name_the_problem_before_any_rank_starts():
    from zero_ref.profiling import trial
    with pytest.raises(TypeError, match="config must be a dict"):
        trial.run_config("ds_config.json", 2)
    with pytest.raises(ds_config.ConfigError, match="zero_optimization.stag"):
        trial.run_config({"train_batch_size": 4, "zero_optimization": {"stag": 2}}, 2)
    with pytest.raises(ds_config.ConfigError, match="train_batch_size"):
        trial.run_config({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 1}, 2)
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        trial.run_config({"train_batch_size": 2}, 2, steps=0)


TINY = dict(vocab_size=97, seq_len=16, d_model=32, n_heads=2, n_layers=2)


@pytest.mark.parametrize("stage", [0, 2])
def test_trial_bytes_and_collectives_are_those_the_plan_predicts(stage):
    from zero_ref.profiling import trial
    plan = sim.Plan(zero_stage=stage, dp=2, micro_batch_size=2, num_microbatches=3, precision="fp32")
    config = plan.to_deepspeed(optimizer={"type": "AdamW", "params": {"lr": 1e-3}})
    run = trial.run_config(config, 2, model=TINY, steps=2, warmup=1, timeout=240)
    psi = run["num_params"]
    want = model_state_bytes(psi, zero_stage=stage, dp=2, precision="fp32", padded=True)
    for rank_bytes in run["memory"]:  # the flat buffer pads to a multiple of dp: at most one element of each state
        for cat in ("params", "grads", "optimizer"):
            assert getattr(want, cat) <= rank_bytes[cat] <= getattr(want, cat) + 4 * 2, (cat, rank_bytes)
    # what the simulator books for the measured step (stage 0's gradients are whole after the all-reduce:
    # its clipping norm needs no collective, which plan_for states by clipping 0)
    booked = fl.work_totals(fl.gpt_model(run["model"]), fl.plan_for(run))["collectives"]
    for op in ("reduce_scatter", "all_gather", "all_reduce"):
        sizes = [b for o, b, _ in booked if o == op]
        calls = run["comm"].get(op, {"calls": 0})["calls"]
        assert calls == len(sizes), (op, run["comm"], booked)
        if op != "all_reduce" or stage == 0:  # (stage 2's all-reduce is the gradient norm: a few floats)
            assert all(abs(run["comm"][op]["bytes"] / calls - b) <= 4 * 2 for b in sizes), (op, run["comm"])
    # the measured step is one the fitted simulator reads: same stage, ranks, micro-batch and accumulation,
    # with zero_ref's collectives (the ZeRO paper's)
    assert fl.plan_for(run) == sim.Plan(zero_stage=stage, dp=2, micro_batch_size=2, num_microbatches=3,
                                        precision="fp32", overlap_comm=False, gradient_clipping=1.0 if stage else 0.0,
                                        framework="zero_ref")
    assert (run["stage"], run["gas"], run["micro_batch"], len(run["losses"])) == (stage, 3, 2, 3)
    assert 0 < run["cpu"]["step"] and 0 < run["wall"]["step"] <= run["wall_median"]
