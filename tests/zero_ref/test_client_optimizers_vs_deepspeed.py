"""The same script on DeepSpeed 0.19.8 and on zero_ref with client optimizers that are not Adam: SGD with
momentum at ZeRO-2 (behind ``zero_allow_untested_optimizer``, with a torch schedule on it; fp32 and bf16) and
at stage 0, Adagrad at ZeRO-1; same losses (fp32: 1e-6 relative, and the weights too; bf16: one bf16 ulp).
DeepSpeed's own optimizer classes: its FusedAdam / DeepSpeedCPUAdam handed to zero_ref train as torch's AdamW,
and zero_ref.ds.ops' Adagrad and Lion step as DeepSpeed's CPU kernels do.
"""
import os

import pytest
import torch

import zero_ref
from tests.zero_ref.cases import build_model, micro_batch

STEPS, GAS, WORLD = 3, 2, 2
pytestmark = [pytest.mark.peers, pytest.mark.usefixtures("one_thread")]


def train(rank, world, which: str, name: str, stage: int) -> dict:
    os.environ["DS_ACCELERATOR"] = "cpu"
    if which == "deepspeed":
        import deepspeed as ds
    else:
        import zero_ref.ds as ds
    model = build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    sched = None
    if name.startswith("sgd"):
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.7 ** s)
    else:  # one group: DeepSpeed rebuilds a client Adagrad over its partitions from the optimizer's defaults;
        # initial_accumulator_value > 0 keeps g / sqrt(sum) tame where the true gradient is ~0 (see cases.ADAM)
        opt = torch.optim.Adagrad(params, lr=0.05, initial_accumulator_value=0.1, weight_decay=0.01)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": GAS,
              "gradient_clipping": 0.5,  # explicit (DeepSpeed's default is 1.0), and active on this toy
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 5000},
              "zero_allow_untested_optimizer": name.startswith("sgd"),
              "bf16": {"enabled": name.endswith("bf16")}}
    engine, *_ = ds.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=config)
    losses = []
    for step in range(STEPS):
        for micro in range(GAS):
            _, loss = engine(*micro_batch(step, micro, rank, world, GAS))
            engine.backward(loss)
            engine.step()
            losses.append(loss.float().item())
    weights = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    return dict(losses=losses, weights=weights, lr=engine.get_lr())


CASES = [("sgd", 2), ("sgd", 0), ("adagrad", 1), ("sgd-bf16", 2)]


def bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """One bf16 unit in the last place at each value of ``t`` (8 significant bits)."""
    return 2.0 ** (torch.floor(torch.log2(t.abs().clamp_min(1e-30))) - 7)


def both_engines(rank, world):
    return {(which, name, stage): train(rank, world, which, name, stage) for name, stage in CASES
            for which in ("zero_ref", "deepspeed")}


@pytest.fixture(scope="module")
def runs():
    return zero_ref.launch(both_engines, WORLD, timeout=900, echo=False)


@pytest.mark.slow
@pytest.mark.parametrize("name,stage", CASES)
def test_same_script_same_losses(runs, name, stage):
    for res in runs:
        ours, theirs = res["zero_ref", name, stage], res["deepspeed", name, stage]
        if name.endswith("bf16"):  # (measured: one loss of twelve one ulp apart, the rest equal)
            want = torch.tensor(theirs["losses"])
            assert ((torch.tensor(ours["losses"]) - want).abs() <= bf16_ulp(want)).all()
            continue  # (weights: the fp32 cases; in bf16 the gradients are bf16 sums added in other orders)
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6, abs=0)
        assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-12)
        for n, want in theirs["weights"].items():
            assert (ours["weights"][n] - want).abs().max() <= 1e-6 * want.abs().max(), n
    start = dict(build_model().named_parameters())
    moved = max((w - start[n]).abs().max().item() for n, w in runs[0]["zero_ref", name, stage]["weights"].items())
    assert moved > 1e-3  # it trained: far beyond the tolerance


@pytest.fixture
def deepspeed(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    return pytest.importorskip("deepspeed")


@pytest.mark.timeout(900)  # DeepSpeed builds its fused_adam and cpu_adam ops on first use (minutes here)
def test_deepspeeds_own_adams_train_on_zero_ref_as_adamw(deepspeed, one_rank):
    """A script that imports FusedAdam / DeepSpeedCPUAdam from the real DeepSpeed (before any alias) hands zero_ref
    DeepSpeed's classes: they are read as AdamW (``adam_w_mode``), with no key needed, as DeepSpeed lists them."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from tests.zero_ref.cases import CFG
    from zero_ref.models import make_batch
    batches = [make_batch(CFG, 2, seed=100 + s) for s in range(3)]
    runs = []
    for make in (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
                 lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.1),
                 lambda ps: DeepSpeedCPUAdam(ps, lr=1e-2, weight_decay=0.1)):
        model = build_model()
        optimizer = make([p for p in model.parameters() if p.requires_grad])
        engine, *_ = zero_ref.initialize(model=model, optimizer=optimizer,
                                         config={"train_batch_size": 2, "zero_optimization": {"stage": 2}})
        assert engine.optimizer.client is None and engine.optimizer.adam.adamw
        for idx, targets in batches:
            engine.backward(engine(idx, targets)[1])
            engine.step()
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))  # torch's AdamW, bit for bit


@pytest.mark.timeout(900)  # DeepSpeed builds its cpu_adagrad and cpu_lion ops on first use
@pytest.mark.parametrize("ours,theirs,kwargs", [
    ("adagrad.DeepSpeedCPUAdagrad", "adagrad.DeepSpeedCPUAdagrad", dict(lr=0.05, weight_decay=0.1)),
    ("lion.DeepSpeedCPULion", "lion.DeepSpeedCPULion", dict(lr=0.01, betas=(0.8, 0.95), weight_decay=0.1)),
    ("lion.FusedLion", "lion.DeepSpeedCPULion", dict(lr=0.01, betas=(0.8, 0.95))),
], ids=["cpu-adagrad", "cpu-lion", "fused-lion"])
def test_ops_step_as_deepspeeds_kernels(deepspeed, ours, theirs, kwargs):
    """zero_ref.ds.ops' Adagrad and Lion against DeepSpeed's CPU kernels (built on first use), with DeepSpeed's
    defaults; fp32, 1e-6 relative. (FusedLion's own kernel is CUDA: its arithmetic is the CPU one's but at c = 0,
    which these random gradients never hit.)"""
    import importlib
    import inspect
    mine = getattr(importlib.import_module("zero_ref.ds.ops." + ours.split(".")[0]), ours.split(".")[1])
    real = getattr(importlib.import_module("deepspeed.ops." + theirs.split(".")[0]), theirs.split(".")[1])
    if ours == theirs:
        def defaults(cls):
            return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        assert defaults(mine) == defaults(real)
    torch.manual_seed(0)
    w = torch.randn(1000)
    out = []
    for cls in (mine, real):
        p = torch.nn.Parameter(w.clone())
        opt = cls([p], **kwargs)
        for s in range(5):
            p.grad = torch.sin(p.detach() * 3 + s)
            opt.step()
        out.append(p.detach())
    assert (out[0] - out[1]).abs().max() <= 1e-6 * out[1].abs().max()
    assert (out[1] - w).abs().max() > 1e-3  # it moved
