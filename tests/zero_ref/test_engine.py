"""zero_ref.initialize against deepspeed.initialize: same script, same config, same numbers.

Two CPU ranks (gloo), fp32, every ZeRO stage, gradient accumulation 2, gradient clipping set
explicitly (and active: the toy's gradient norm is above it), and a WarmupDecayLR schedule. Losses,
learning rates, step counters and the final parameters of both engines agree to 1e-6 (relative to
the parameter's scale): they add the same numbers in different orders (all-reduce vs reduce-scatter,
buckets of different sizes), so they differ by rounding only (at most 1.2e-7 seen here; turning the
clipping off on one side alone moves the weights by 5e-3, so the check sees the clipping).
"""
import contextlib
import os

import pytest
import torch

import zero_ref
from zero_ref.config import ConfigError
from tests.zero_ref.cases import ADAM, build_model, micro_batch

STEPS, GAS, WORLD = 3, 2, 2


def ds_config(stage: int, bf16: bool = False, scheduler: bool = True, gas: int = GAS) -> dict:
    return {
        "bf16": {"enabled": bf16},
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas,
        "gradient_clipping": 0.05,  # explicit: DeepSpeed 0.19.8's default is 1.0, not off
        "optimizer": {"type": "AdamW", "params": {"lr": ADAM.lr, "weight_decay": ADAM.weight_decay, "eps": ADAM.eps,
                                                   "torch_adam": True}},  # torch's AdamW: no 40 s kernel build
        **({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": ADAM.lr,
                                                             "warmup_num_steps": 2, "warmup_type": "linear",
                                                             "total_num_steps": 4}}} if scheduler else {}),
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 5000},  # several buckets
    }


def hf_groups(model) -> list[dict]:
    """The groups of HF / DeepSpeed-Chat scripts (decay on matrices, none on biases and norms), with a
    group lr and betas of its own on top."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if p.dim() >= 2]},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0, "lr": 2 * ADAM.lr,
             "betas": (0.8, 0.99)}]


def train(rank, world, which: str, stage: int, bf16: bool = False, script: str = "plain") -> dict:
    """One engine, one stage: losses per micro-step, lr per step, counters and the final weights.

    ``script="nanogpt"``: seeded per rank (nanoGPT seeds ``1337 + rank``) and param groups with their own
    weight decay, lr and betas in ``model_parameters``, no scheduler (DeepSpeed's would set every group's
    lr alike): the engine must broadcast rank 0's weights and step each group with its own values."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    if which == "deepspeed":
        import deepspeed as ds
    else:
        import zero_ref.ds as ds
    nanogpt = script == "nanogpt"
    model = build_model(seed=1337 + rank if nanogpt else 0)
    params = hf_groups(model) if nanogpt else [p for p in model.parameters() if p.requires_grad]
    if script == "subset":  # bing_bert leaves a module out of model_parameters: it is not trained
        params = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("ln_f.")]
    # no_sync: the script accumulates itself (the config's gradient_accumulation_steps is 1): the first
    # micro-batch's backward inside engine.no_sync(), the second's outside, then one step()
    no_sync = script == "no_sync"
    engine, optimizer, _, scheduler = ds.initialize(model=model, model_parameters=params,
                                                    config=ds_config(stage, bf16, scheduler=not nanogpt,
                                                                     gas=1 if no_sync else GAS))
    losses, lrs, bounds = [], [], []
    for step in range(STEPS):
        for micro in range(GAS):
            with engine.no_sync() if no_sync and micro < GAS - 1 else contextlib.nullcontext():
                bounds.append(engine.is_gradient_accumulation_boundary())
                _, loss = engine(*micro_batch(step, micro, rank, world, GAS))
                engine.backward(loss)
            if not no_sync or micro == GAS - 1:
                engine.step()
            losses.append(loss.item())
        lrs.append(engine.get_lr() if nanogpt else engine.get_lr()[0])
    if stage == 3:  # gather the partitioned parameters to read them
        gathered = (ds.zero.GatheredParameters(list(model.parameters())) if which == "deepspeed" else
                    zero_ref.stages.zero3.GatheredParameters(list(model.parameters())))
    else:
        gathered = torch.enable_grad()  # (no-op context)
    with gathered:
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return dict(losses=losses, lrs=lrs, bounds=bounds, weights=weights, steps=engine.global_steps,
                norm=engine.get_global_grad_norm(),
                samples=engine.global_samples, batch=(engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                                                      engine.gradient_accumulation_steps()),
                stage=engine.zero_optimization_stage(), scheduler=type(scheduler).__name__,
                optim=optimizer.state_dict() if stage == 0 else None)


def both_engines(rank, world):
    runs = {(which, stage): train(rank, world, which, stage) for stage in (0, 1, 2, 3)
            for which in ("zero_ref", "deepspeed")}
    runs.update({(which, stage, "bf16"): train(rank, world, which, stage, bf16=True) for stage in (0, 2)
                 for which in ("zero_ref", "deepspeed")})
    runs.update({(which, stage, "nanogpt"): train(rank, world, which, stage, script="nanogpt") for stage in (0, 2, 3)
                 for which in ("zero_ref", "deepspeed")})
    runs.update({(which, stage, "subset"): train(rank, world, which, stage, script="subset") for stage in (0, 2)
                 for which in ("zero_ref", "deepspeed")})
    runs.update({(which, stage, "no_sync"): train(rank, world, which, stage, script="no_sync") for stage in (0, 1)
                 for which in ("zero_ref", "deepspeed")})
    runs["refusals"] = no_sync_refusals()
    return runs


def no_sync_refusals() -> list[str]:
    """What zero_ref's no_sync refuses, as DeepSpeed does: ZeRO-2/3, re-entry, step() inside."""
    said = []
    for stage, misuse in ((2, "enter"), (0, "reenter"), (0, "step")):
        engine, *_ = zero_ref.initialize(model=build_model(), config=ds_config(stage, scheduler=False, gas=1))
        try:
            with engine.no_sync():
                if misuse == "reenter":
                    with engine.no_sync():
                        pass
                if misuse == "step":
                    _, loss = engine(*micro_batch(0, 0, 0, 1, 1))
                    engine.backward(loss)
                    engine.step()
        except RuntimeError as e:
            said.append(str(e).split(" (")[0].split(":")[0])
    return said


@pytest.fixture(scope="module")
def runs():
    return zero_ref.launch(both_engines, WORLD, timeout=900, echo=False)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_same_config_same_numbers(runs, stage):
    for rank, res in enumerate(runs):
        ours, theirs = res[("zero_ref", stage)], res[("deepspeed", stage)]
        assert ours["batch"] == theirs["batch"] == (8, 2, 2)
        assert ours["stage"] == theirs["stage"] == stage
        assert ours["scheduler"] == theirs["scheduler"] == "WarmupDecayLR"
        assert ours["bounds"] == theirs["bounds"] == [False, True] * STEPS
        assert (ours["steps"], ours["samples"]) == (theirs["steps"], theirs["samples"]) == (STEPS, 8 * STEPS)
        assert ours["lrs"] == pytest.approx(theirs["lrs"], rel=1e-12)
        assert ours["norm"] > ds_config(stage)["gradient_clipping"]  # the clipping is active
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6), rank
        for name, w in theirs["weights"].items():
            err = (ours["weights"][name] - w).abs().max().item()
            assert err <= 1e-6 * max(1.0, w.abs().max().item()), (stage, name, err)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1])
def test_no_sync_accumulates_as_deepspeed(runs, stage):
    """engine.no_sync() (a script accumulating on its own at gradient_accumulation_steps 1): the same losses
    and weights as DeepSpeed's, and the same misuses refused."""
    for res in runs:
        ours, theirs = res[("zero_ref", stage, "no_sync")], res[("deepspeed", stage, "no_sync")]
        assert ours["bounds"] == theirs["bounds"] == [True] * (GAS * STEPS)
        assert (ours["steps"], ours["samples"]) == (theirs["steps"], theirs["samples"]) == (STEPS, 4 * STEPS)
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6)
        for name, w in theirs["weights"].items():
            err = (ours["weights"][name] - w).abs().max().item()
            assert err <= 1e-6 * max(1.0, w.abs().max().item()), (stage, name, err)
        assert res["refusals"] == ["no_sync is incompatible with the gradient partitioning of ZeRO stage 2",
                                   "no_sync context manager reentry is unsupported",
                                   "engine.step() inside no_sync()"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 2])
def test_same_config_same_numbers_in_bf16(runs, stage):
    """bf16 with fp32 master weights: the same to bf16's resolution (one unit in the last place, 2**-7
    relative, was the largest difference seen; different summation orders round differently)."""
    for res in runs:
        ours, theirs = res[("zero_ref", stage, "bf16")], res[("deepspeed", stage, "bf16")]
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=2 ** -6)
        for name, w in theirs["weights"].items():
            assert ours["weights"][name].dtype == w.dtype == torch.bfloat16
            err = (ours["weights"][name].float() - w.float()).abs().max().item()
            assert err <= 2 ** -6 * max(1.0, w.float().abs().max().item()), (stage, name, err)


@pytest.mark.slow
def test_zero0_optimizer_state_dict_as_deepspeeds(runs):
    """At ZeRO-0 the optimizer initialize returns holds what DeepSpeed's holds, in its shape: torch AdamW's dict
    in fp32 (one group, and the nanoGPT script's groups), FP16_UnfusedOptimizer's in bf16, whose step counts
    one more (its zero-gradient step at set-up). Moments to 1e-5 relative to each tensor's largest entry
    (another summation order)."""
    for res in runs:
        for key in ((0,), (0, "nanogpt")):
            ours, theirs = (res[(which, *key)]["optim"] for which in ("zero_ref", "deepspeed"))
            assert ours["param_groups"] == theirs["param_groups"], key
            for i, s in theirs["state"].items():
                assert ours["state"][i]["step"] == s["step"]
                for k in ("exp_avg", "exp_avg_sq"):
                    err = (ours["state"][i][k] - s[k]).abs().max().item()
                    assert err <= 1e-5 * s[k].abs().max().item(), (key, i, k, err)
        ours, theirs = (res[(which, 0, "bf16")]["optim"] for which in ("zero_ref", "deepspeed"))
        assert list(ours) == list(theirs)
        assert [[m.shape for m in g] for g in ours["fp32_groups"]] == [[m.shape for m in g] for g in theirs["fp32_groups"]]
        inner = ours["optimizer_state_dict"], theirs["optimizer_state_dict"]
        assert inner[0]["param_groups"] == inner[1]["param_groups"]
        assert {float(s["step"]) + 1 for s in inner[0]["state"].values()} == {float(s["step"]) for s in inner[1]["state"].values()}


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_per_rank_seeds_and_param_groups_as_deepspeed(runs, stage):
    """Both engines start every rank from rank 0's weights and step each group with its own values."""
    first = runs[0][("deepspeed", stage, "nanogpt")]
    for res in runs:
        ours, theirs = res[("zero_ref", stage, "nanogpt")], res[("deepspeed", stage, "nanogpt")]
        assert ours["lrs"] == theirs["lrs"] == [[ADAM.lr, 2 * ADAM.lr]] * STEPS
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6)
        for name, w in theirs["weights"].items():
            assert torch.equal(w, first["weights"][name])  # one model on every rank
            err = (ours["weights"][name] - w).abs().max().item()
            assert err <= 1e-6 * max(1.0, w.abs().max().item()), (stage, name, err)
    plain = runs[0][("zero_ref", stage)]  # seed 0, one group, a schedule: another model
    assert any(not torch.allclose(plain["weights"][n], w) for n, w in first["weights"].items())


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 2])
def test_parameters_left_out_of_model_parameters_are_not_trained_as_in_deepspeed(runs, stage):
    start = build_model().state_dict()
    for res in runs:
        ours, theirs = res[("zero_ref", stage, "subset")], res[("deepspeed", stage, "subset")]
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6)
        for name, w in theirs["weights"].items():
            frozen = name.startswith("ln_f.") or name == "pos_emb.weight"  # left out, and frozen by build_model
            assert torch.equal(w, start[name]) == frozen, name
            err = (ours["weights"][name] - w).abs().max().item()
            assert err <= 1e-6 * max(1.0, w.abs().max().item()), (stage, name, err)


# ------------------------------------------------------------------ one rank, in this process

def test_one_rank_engine_reproduces_the_plain_loop(one_rank):
    """Chapter 10's first check: the ported script's losses and weights are the plain loop's."""
    from zero_ref.ds.engine import initialize
    from tests.zero_ref.cases import CFG
    from zero_ref.models import make_batch

    def batches():
        return [make_batch(CFG, 4, seed=100 + s) for s in range(3)]

    model = build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=ADAM.lr, weight_decay=ADAM.weight_decay, eps=ADAM.eps, foreach=False)
    plain = []
    for idx, targets in batches():
        _, loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        plain.append(loss.item())

    ported_model = build_model()
    opt = torch.optim.AdamW([p for p in ported_model.parameters() if p.requires_grad], lr=ADAM.lr,
                            weight_decay=ADAM.weight_decay, eps=ADAM.eps)
    engine, optimizer, _, _ = initialize(model=ported_model, optimizer=opt,
                                         config={"train_batch_size": 4, "gradient_clipping": 0.0})
    ported = []
    for idx, targets in batches():
        _, loss = engine(idx, targets)
        engine.backward(loss)
        engine.step()
        ported.append(loss.item())
    assert ported == plain  # bit for bit: the stage runs torch's AdamW arithmetic on a flat buffer
    for (n, a), b in zip(model.named_parameters(), ported_model.parameters()):
        assert torch.equal(a, b), n
    assert engine.global_steps == 3 and engine.dp_world_size == 1 and optimizer is engine.optimizer


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1),                                   # L2 decay
    lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),      # = AdamW
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)], ids=["adam-l2", "adam-decoupled", "adamw"])
def test_a_client_adam_runs_in_its_own_weight_decay_mode(one_rank, make):
    """The engine steps a client optimizer the way torch would: the decay mode comes from the optimizer's
    decoupled_weight_decay flag (torch's AdamW is an Adam subclass that sets it), not from its class."""
    from zero_ref.ds.engine import initialize
    from tests.zero_ref.cases import CFG
    from zero_ref.models import make_batch
    batches = [make_batch(CFG, 4, seed=100 + s) for s in range(3)]
    model, ported_model = build_model(), build_model()
    opt = make([p for p in model.parameters() if p.requires_grad])
    for idx, targets in batches:
        model(idx, targets)[1].backward()
        opt.step()
        opt.zero_grad()
    engine, *_ = initialize(model=ported_model, optimizer=make([p for p in ported_model.parameters() if p.requires_grad]),
                            config={"train_batch_size": 4, "gradient_clipping": 0.0, "zero_optimization": {"stage": 1}})
    for idx, targets in batches:
        engine.backward(engine(idx, targets)[1])
        engine.step()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ported_model.parameters()))
    assert diff <= 1e-6  # the other mode ends ≈ lr·wd·steps·|w| ≈ 1e-3·|w| away


def test_a_torch_scheduler_on_the_client_optimizer_drives_the_rate(one_rank):
    from zero_ref.ds.engine import initialize
    model = build_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    engine, _, _, lr_scheduler = initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                            config={"train_batch_size": 2})
    assert lr_scheduler is sched
    seen = []
    for step in range(3):
        _, loss = engine(*micro_batch(step, 0, 0, 1, 1))
        engine.backward(loss)
        engine.step()
        seen.append(engine.optimizer.param_groups[0]["lr"])  # the rate this step used
    assert seen == [0.1, 0.05, 0.025] and engine.get_lr() == [0.0125]


def test_clear_errors(one_rank):
    import traceback
    from zero_ref.ds.engine import initialize
    model = build_model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    adamw = {"optimizer": {"type": "AdamW"}}
    cases = [
        (dict(config={"train_batch_size": 2, "zero_optimization": {"stage": 5}}), "zero_optimization.stage"),
        (dict(config={"train_batch_size": 2}), "none given"),
        (dict(config={"train_batch_size": 2, "zero_optimization": {"stage": 1}},
              optimizer=torch.optim.SGD(trainable, lr=0.1)), "zero_allow_untested_optimizer"),
        (dict(config={"train_batch_size": 2, **adamw}, model_parameters=trainable + [torch.nn.Parameter(torch.ones(2))]),
         "not one of the module's parameters"),
        (dict(config={"train_batch_size": 2, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
              optimizer=torch.optim.AdamW(trainable)), "zero_force_ds_cpu_optimizer"),
        (dict(config={"train_batch_size": 2, **adamw}, mpu=object()), "mpu"),
        (dict(config="/nonexistent/ds_config.json"), "is not an existing file"),
        (dict(), "no config"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
            initialize(model=model, **kwargs)
        assert "\n" not in str(info.value)
    try:  # a config error surfaces from zero_ref/config/reader.py, one frame under initialize
        initialize(model=model, config={"train_batch_size": 2, "fp16": {"enabled": "yes"}})
    except ConfigError as e:
        frames = traceback.extract_tb(e.__traceback__)
        assert e.key == "fp16.enabled" and frames[-1].filename.endswith(os.path.join("zero_ref", "config", "reader.py"))
        assert len(frames) <= 4, [f.name for f in frames]
    engine, *_ = initialize(model=model, config={"train_batch_size": 2, **adamw})
    with pytest.raises(RuntimeError, match="must follow exactly one backward per micro-batch"):
        engine.step()


@pytest.mark.parametrize("name,params", [
    ("WarmupLR", {}), ("WarmupLR", {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 7}),
    ("WarmupLR", {"warmup_num_steps": 5, "warmup_type": "linear"}),
    ("WarmupDecayLR", {"total_num_steps": 30, "warmup_num_steps": 6, "warmup_min_lr": 1e-5}),
    ("WarmupDecayLR", {"total_num_steps": 20, "warmup_num_steps": 1, "warmup_type": "linear"}),
    ("WarmupCosineLR", {"total_num_steps": 25, "warmup_num_steps": 5, "warmup_min_ratio": 0.1}),
    ("WarmupCosineLR", {"total_num_steps": 4, "warmup_num_steps": 8, "warmup_type": "linear"}),
])
def test_schedules_equal_deepspeeds(name, params, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    ds_schedules = pytest.importorskip("deepspeed.runtime.lr_schedules")
    from zero_ref.ds.runtime import lr_schedules

    class Groups:  # what a schedule needs from an optimizer
        def __init__(self):
            self.param_groups = [{"lr": 2e-3}]

    torch_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)
    theirs, ours = getattr(ds_schedules, name)(torch_opt, **params), lr_schedules.build(name, Groups(), params)
    for _ in range(40):
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12, abs=1e-18)
        ours.step()
        theirs.step()


@pytest.mark.parametrize("name,params", [
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 7}),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 6, "cycle_second_step_size": 4,
                  "cycle_first_stair_count": 3, "decay_step_size": 5, "decay_lr_rate": 0.5, "decay_mom_rate": 0.01,
                  "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}),
    ("OneCycle", {"cycle_min_lr": 2e-3, "cycle_max_lr": 5e-3, "cycle_first_step_size": 5, "cycle_momentum": False}),
    ("LRRangeTest", {}), ("LRRangeTest", {"lr_range_test_min_lr": 1e-5, "lr_range_test_step_size": 3,
                                          "lr_range_test_step_rate": 2.5}),
    ("LRRangeTest", {"lr_range_test_step_size": 4, "lr_range_test_staircase": True}),
])
def test_one_cycle_and_range_test_equal_deepspeeds(name, params, monkeypatch):
    """The rate (and OneCycle's beta1, with beta2 set to 0.99) written into every group, step by step over
    the cycle and the decay after it, equal DeepSpeed 0.19.8's classes on a torch Adam with two groups."""
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    ds_schedules = pytest.importorskip("deepspeed.runtime.lr_schedules")
    from zero_ref import config as C
    from zero_ref.ds.runtime import lr_schedules

    def groups():
        return [{"params": [torch.nn.Parameter(torch.zeros(1))]}, {"params": [torch.nn.Parameter(torch.zeros(1))]}]

    class Groups:  # what a schedule needs from an optimizer: zero_ref's stages hold torch-style groups
        param_groups = [{"lr": 2e-3, "betas": (0.9, 0.999)}, {"lr": 2e-3, "betas": (0.9, 0.999)}]

    torch_opt = torch.optim.Adam(groups(), lr=2e-3)
    read = C.parse({"train_batch_size": 1, "scheduler": {"type": name, "params": params}}).scheduler.params
    from_config = {f: getattr(read, f) for f in read.__dataclass_fields__}
    theirs, ours = getattr(ds_schedules, name)(torch_opt, **params), lr_schedules.build(name, Groups(), from_config)
    for _ in range(30):
        for mine, their in zip(ours.optimizer.param_groups, torch_opt.param_groups):
            assert mine["lr"] == pytest.approx(their["lr"], rel=1e-12, abs=1e-18)
            assert mine["betas"] == pytest.approx(their["betas"], rel=1e-12)
        ours.step()
        theirs.step()
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12, abs=1e-18)
    assert ours.state_dict() == theirs.state_dict()
    if name == "OneCycle" and params.get("cycle_momentum", True):
        assert {g["betas"][1] for g in Groups.param_groups} == {0.99}  # DeepSpeed's fixed beta2


def test_dataloader_offload_and_progress(one_rank, capsys):
    """training_data= gives DeepSpeed's loader (micro-batches, this rank's share); the config's offload
    and logging keys reach the stage and the engine."""
    from torch.utils.data import TensorDataset
    from zero_ref.ds.engine import initialize
    from tests.zero_ref.cases import CFG
    from zero_ref.models import make_batch
    idx, targets = make_batch(CFG, 10, seed=0)
    model = build_model()
    config = {"train_micro_batch_size_per_gpu": 4, "dataloader_drop_last": True, "steps_per_print": 1,
              "wall_clock_breakdown": True, "memory_breakdown": True, "optimizer": {"type": "AdamW"},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    engine, optimizer, loader, _ = initialize(model=model, config=config, training_data=TensorDataset(idx, targets))
    assert optimizer.offload is not None and len(loader) == 2  # 10 samples, micro 4, last 2 dropped
    for batch_idx, batch_targets in loader:
        assert batch_idx.shape[0] == 4
        engine.backward(engine(batch_idx, batch_targets)[1])
        engine.step()
    out = capsys.readouterr().out
    assert "[zero_ref] step=2, skipped=0" in out and "forward:" in out and "bytes held (rank 0) | params:" in out


# ------------------------------------------------------------------ DeepSpeed's surface beyond the loop

def test_entry_points_have_deepspeeds_arguments(monkeypatch):
    """add_config_arguments adds DeepSpeed's arguments (same names, defaults, parses); init_distributed
    takes DeepSpeed's parameters in DeepSpeed's order (a positional "gloo" is the backend)."""
    import argparse
    import inspect
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    deepspeed = pytest.importorskip("deepspeed")
    for argv in ([], ["--deepspeed", "--deepspeed_config", "ds.json"], ["--deepscale_config", "old.json"]):
        ours = vars(zero_ref.add_config_arguments(argparse.ArgumentParser()).parse_args(argv))
        theirs = vars(deepspeed.add_config_arguments(argparse.ArgumentParser()).parse_args(argv))
        assert ours == theirs, argv
    ours, theirs = (inspect.signature(f).parameters for f in (zero_ref.init_distributed, deepspeed.init_distributed))
    assert list(ours) == list(theirs)
    assert [p.default for p in ours.values()][:3] == [None, True, 29500]


def test_args_config_passthrough_and_16bit_save(one_rank, tmp_path):
    import argparse
    import json
    from zero_ref.ds.engine import initialize
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 2, "steps_per_print": 7,
                                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
    args = zero_ref.add_config_arguments(argparse.ArgumentParser()).parse_args(["--deepscale_config", str(path)])
    model = build_model()
    model.label = "toy"  # a script's own attribute on its model
    with pytest.warns(DeprecationWarning, match="deepscale_config is deprecated"):
        engine, *_ = initialize(args=args, model=model)
    assert engine.steps_per_print() == 7
    assert engine.label == "toy" and engine.cfg is model.cfg  # the module's attributes, through the engine
    with pytest.raises(AttributeError, match="nor its module\\) has no attribute 'nothing'"):
        engine.nothing
    assert engine.save_16bit_model(str(tmp_path), "weights.bin")
    saved = torch.load(tmp_path / "weights.bin", weights_only=True)
    assert list(saved) == list(model.state_dict()) and all(torch.equal(v, model.state_dict()[k]) for k, v in saved.items())
    engine.destroy()


@pytest.mark.parametrize("gather", [False, True])
def test_16bit_save_at_zero3_needs_the_gather_flag(one_rank, tmp_path, gather):
    from zero_ref.ds.engine import initialize
    model = build_model()
    full = {k: v.clone() for k, v in model.state_dict().items()}
    engine, *_ = initialize(model=model, config={
        "train_batch_size": 2, "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": gather}})
    assert engine.save_16bit_model(str(tmp_path)) == gather  # DeepSpeed's answer: False, nothing written
    assert (tmp_path / "pytorch_model.bin").exists() == gather
    if gather:
        saved = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
        assert {v.dtype for v in saved.values()} == {torch.bfloat16} and list(saved) == list(full)
        assert all(torch.equal(saved[k], v.to(torch.bfloat16)) for k, v in full.items())


def test_get_accelerator_answers_as_deepspeeds_on_this_machine(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    pytest.importorskip("deepspeed")
    from deepspeed.accelerator import get_accelerator as theirs
    ours, ds = zero_ref.ds.accelerator.get_accelerator(), theirs()
    if ds.device_name() != ours.device_name():
        pytest.skip(f"DeepSpeed chose the {ds.device_name()} accelerator here")
    for call in ("device_name()", "device_name(0)", "current_device_name()", "is_available()",
                 "is_bf16_supported()", "is_fp16_supported()", "device(0)"):
        a, b = eval(f"ours.{call}"), eval(f"ds.{call}")
        assert (bool(a) == bool(b)) if call.startswith("is_") else (a == b), call  # (DeepSpeed's CPU fp16 answer
        # is None, not False, where oneDNN has no fp16)
    if ds.communication_backend_name() in ("gloo", "nccl"):  # (DeepSpeed picks oneCCL where it is installed)
        assert ours.communication_backend_name() == ds.communication_backend_name()
    t = torch.ones(2)
    assert ours.on_accelerator(t) == (ours.device_name() == "cpu")


def stage0_run(groups: bool, precision: str = "fp32", steps: range = range(STEPS), state: dict | None = None):
    """ZeRO-0 through initialize on one rank: the optimizer steps ``steps`` (GAS 1, no schedule, no clipping),
    after loading ``state`` (the model's and the optimizer's) if given. Returns the engine and optimizer."""
    from zero_ref.ds.engine import initialize
    model = build_model()
    config = {**ds_config(0, bf16=precision == "bf16", scheduler=False, gas=1), "gradient_clipping": 0.0}
    if precision == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 8}
    engine, optimizer, *_ = initialize(model=model, config=config, model_parameters=hf_groups(model) if groups
                                       else [p for p in model.parameters() if p.requires_grad])
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    for step in steps:
        _, loss = engine(*micro_batch(step, 0, 0, 1, 1))
        engine.backward(loss)
        engine.step()
    return engine, optimizer


def test_zero0_optimizer_state_dict_is_torch_adamws(one_rank):
    """At stage 0 DeepSpeed returns its basic optimizer (torch's AdamW here): state_dict() is torch's, per
    parameter, with each group's own hyper-parameters; it loads into torch's AdamW, which then takes the
    same step, and a resumed engine continues bit for bit."""
    engine, optimizer = stage0_run(groups=True)
    model = engine.module
    torch.manual_seed(0)
    ref_model = build_model()
    ref = torch.optim.AdamW(hf_groups(ref_model), lr=ADAM.lr, eps=ADAM.eps, weight_decay=ADAM.weight_decay)
    for step in range(STEPS):
        _, loss = ref_model(*micro_batch(step, 0, 0, 1, 1))
        loss.backward()
        ref.step()
        ref.zero_grad()
    ours, theirs = optimizer.state_dict(), ref.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]  # keys, values and parameter indices
    assert ours["state"].keys() == theirs["state"].keys() and len(ours["state"]) == len(list(ref_model.parameters())) - 1
    for i, s in theirs["state"].items():  # (the frozen position embedding has none)
        assert ours["state"][i].keys() == s.keys() and ours["state"][i]["step"] == s["step"] == STEPS
        for k in ("exp_avg", "exp_avg_sq"):  # another summation order inside the Adam update
            assert torch.allclose(ours["state"][i][k], s[k], rtol=1e-5, atol=1e-9), (i, k)
    # torch's AdamW takes zero_ref's state and steps as it would have
    again = torch.optim.AdamW(hf_groups(model))
    again.load_state_dict(ours)
    assert again.state_dict()["param_groups"] == theirs["param_groups"]
    # save after two steps, resume for the third: the same weights as three steps in one go
    _, half = stage0_run(groups=True, steps=range(STEPS - 1))
    saved = {"model": {k: v.clone() for k, v in half.module.state_dict().items()}, "optimizer": half.state_dict()}
    first = {n: p.detach().clone() for n, p in half.module.named_parameters()}
    resumed, _ = stage0_run(groups=True, steps=range(STEPS - 1, STEPS), state=saved)
    for n, p in resumed.module.named_parameters():
        assert torch.equal(p, model.get_parameter(n)), n
    assert not torch.equal(first["tok_emb.weight"], model.tok_emb.weight)  # (the third step moved it)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_zero0_optimizer_state_dict_in_16_bits_is_deepspeeds_wrappers(one_rank, precision):
    """bf16/fp16 at stage 0: DeepSpeed's FP16_UnfusedOptimizer dict (the loss scale, the inner AdamW's dict
    over the fp32 masters, the masters); a resumed engine continues bit for bit."""
    engine, optimizer = stage0_run(groups=False, precision=precision)
    sd = optimizer.state_dict()
    dynamic = precision == "fp16"
    assert list(sd) == ["dynamic_loss_scale", "cur_scale", "cur_iter",
                        *(["last_overflow_iter", "scale_factor", "scale_window"] if dynamic else []),
                        "optimizer_state_dict", "fp32_groups"]
    assert sd["dynamic_loss_scale"] == dynamic and sd["cur_scale"] == (2.0 ** 8 if dynamic else 1.0)
    trainable = [p for p in engine.module.parameters() if p.requires_grad]
    (masters,) = sd["fp32_groups"]
    assert [m.dtype for m in masters] == [torch.float32] * len(trainable)
    assert all(torch.equal(m.to(p.dtype), p) for m, p in zip(masters, trainable))  # the weights are masters cast down
    assert not all(torch.equal(m, p.float()) for m, p in zip(masters, trainable))  # ... and the masters keep more
    assert sd["optimizer_state_dict"]["state"][0]["step"] == STEPS - optimizer.skipped_steps
    _, half = stage0_run(groups=False, precision=precision, steps=range(STEPS - 1))
    saved = {"model": {k: v.clone() for k, v in half.module.state_dict().items()}, "optimizer": half.state_dict()}
    resumed, again = stage0_run(groups=False, precision=precision, steps=range(STEPS - 1, STEPS), state=saved)
    for n, p in resumed.module.named_parameters():
        assert torch.equal(p, engine.module.get_parameter(n)), n
    assert again.loss_scale == optimizer.loss_scale
    with pytest.raises(ValueError, match="trains in .*16, which takes DeepSpeed's FP16 wrapper's dict"):
        again.load_state_dict(sd["optimizer_state_dict"])


def deepspeed_fp16_on_cpu(rank, world):
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    try:
        deepspeed.initialize(model=build_model(), config={"train_batch_size": 2, "fp16": {"enabled": True},
                                                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    except ValueError as e:
        return bool(get_accelerator().is_fp16_supported()), str(e)
    return bool(get_accelerator().is_fp16_supported()), None


@pytest.mark.peers
def test_deepspeed_refuses_fp16_on_this_cpu_as_the_readme_says():
    """zero_ref trains fp16 on CPU (chapter 12); DeepSpeed 0.19.8 refuses it where oneDNN has no fp16."""
    supported, error = zero_ref.launch(deepspeed_fp16_on_cpu, 1, timeout=300)[0]
    assert error == (None if supported else "Type fp16 is not supported on your device.")


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_optimizer_state_dict_names_the_checkpoint_way(one_rank, stage):
    """DeepSpeed's ZeRO-1/2 optimizer returns this rank's partition in state_dict(); zero_ref keeps it in its
    checkpoints and says so, rather than an AttributeError."""
    from zero_ref.ds.engine import initialize
    config = {**ds_config(stage, bf16=False, scheduler=False, gas=1), "gradient_clipping": 0.0}
    model = build_model()
    _, optimizer, *_ = initialize(model=model, config=config,
                                  model_parameters=[p for p in model.parameters() if p.requires_grad])
    for call in (optimizer.state_dict, lambda: optimizer.load_state_dict({})):
        with pytest.raises(NotImplementedError, match=rf"ZeRO-{stage}.*engine.save_checkpoint\(dir\)"):
            call()
