"""Client optimizers that are not Adam (SGD, Adagrad, a user's own) at ZeRO stages 0-3 on two gloo ranks:
each stage runs the optimizer's own step on its partition and equals the same optimizer in one process on
the full batch (fp32, 1e-6 relative); its state per rank is 1/2 of the one-process state; the engine
refuses it at ZeRO 1-3 without ``zero_allow_untested_optimizer``, as DeepSpeed does; a checkpoint keeps
its partitioned state, and resuming gives the losses of a run never interrupted.
"""
import pytest
import torch

import zero_ref
from tests.zero_ref.cases import build_model, micro_batch
from zero_ref.stages import STAGES

STEPS, WORLD = 3, 2
pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


class HeavyBall(torch.optim.Optimizer):
    """A user's own optimizer: momentum with a rate that decays with a step count kept as a Python int."""

    def __init__(self, params, lr=0.05, beta=0.8):
        super().__init__(params, {"lr": lr, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["buf"], st["n"] = torch.zeros_like(p), 0
                st["n"] += 1
                st["buf"].mul_(group["beta"]).add_(p.grad)
                p.add_(st["buf"], alpha=-group["lr"] / (1 + st["n"]))


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    # initial_accumulator_value > 0: g / sqrt(sum) stays tame where the true gradient is ~0 (see cases.ADAM)
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05, initial_accumulator_value=0.1, weight_decay=0.01),
    "heavy-ball": lambda ps: HeavyBall(ps),
}


def groups(model):
    """Two param groups with their own lr and weight decay (matrices; vectors)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if p.dim() >= 2]},
            {"params": [p for p in trainable if p.dim() < 2], "lr": 0.02, "weight_decay": 0.0}]


def lr_at(step: int) -> float:
    return 0.7 ** step  # a schedule: every step changes the groups' rates


def state_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t.dim() > 0)


def reference(name: str, clip: float) -> tuple[dict, int]:
    """The optimizer in one process on the full batch: final weights and its state's bytes."""
    model = build_model()
    opt = OPTIMIZERS[name](groups(model))
    base = [g["lr"] for g in opt.param_groups]
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(STEPS):
        batches = [micro_batch(step, 0, r, WORLD, 1) for r in range(WORLD)]  # the global batch
        idx, targets = (torch.cat(t) for t in zip(*batches))
        model(idx, targets)[1].backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        for g, lr in zip(opt.param_groups, base):
            g["lr"] = lr * lr_at(step)
        opt.step()
        opt.zero_grad()
    held = state_bytes(v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, held


def train(rank, world, cases):
    out = {}
    for name, stage, clip in cases:
        model = build_model()
        opt = STAGES[stage](model, optimizer=OPTIMIZERS[name](groups(model)), gradient_clipping=clip,
                            reduce_bucket_size=3000)  # several buckets, groups interleaved in them
        base = [g["lr"] for g in opt.param_groups]
        for step in range(STEPS):
            opt.backward(model(*micro_batch(step, 0, rank, world, 1))[1])
            for g, lr in zip(opt.param_groups, base):
                g["lr"] = lr * lr_at(step)
            assert opt.step()
        if stage == 3:
            state = opt.state_dict()
        else:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        out[name, stage, clip] = state, state_bytes(opt.client.state_tensors()), \
            any(b.partition.exp_avg is not None for b in opt.buckets)
    return out


@pytest.mark.slow
def test_each_stage_runs_the_client_optimizer_as_one_process_does():
    cases = [(name, stage, clip) for name in OPTIMIZERS for stage in range(4)
             for clip in ((0.0, 0.5) if name == "sgd" else (0.0,))]  # 0.5: below the toy's norm, so it clips
    refs = {(name, clip): reference(name, clip) for name, _, clip in cases}
    results = zero_ref.launch(train, WORLD, cases, timeout=300)
    for case in cases:
        name, stage, clip = case
        ref, ref_bytes = refs[name, clip]
        for state, _, _ in (r[case] for r in results):
            for k, want in ref.items():
                diff = (state[k] - want).abs().max().item()
                assert diff <= 1e-6 * want.abs().max().item(), f"{case} {k}: max |Δ| {diff:.3g}"
        held = [r[case][1] for r in results]
        if stage == 0:  # every rank holds all of it, as the one process does
            assert held == [ref_bytes] * WORLD, (case, held, ref_bytes)
        else:  # each rank its half: together exactly the one process's state (padding is not stepped)
            assert sum(held) == ref_bytes and max(held) <= 0.6 * ref_bytes, (case, held, ref_bytes)
        assert not any(r[case][2] for r in results), f"{case}: Adam moments were allocated beside the optimizer's state"


# ------------------------------------------------------------------ the engine: DeepSpeed's rule, checkpoints

def test_the_engine_takes_deepspeeds_tested_list_and_others_only_with_the_key(one_rank, tmp_path):
    """runtime/engine.py, ``_do_optimizer_sanity_check``: at ZeRO 1-3 an optimizer whose exact class is not in
    ``ZERO_SUPPORTED_OPTIMIZERS`` needs ``zero_allow_untested_optimizer``; stage 0 takes any torch optimizer."""
    from zero_ref.checkpoint.format import CheckpointError
    from zero_ref.config import ConfigError
    from zero_ref.ds import initialize
    from zero_ref.ds.ops.adagrad import DeepSpeedCPUAdagrad
    from zero_ref.ds.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from zero_ref.ds.ops.lion import DeepSpeedCPULion, FusedLion

    class MyAdamW(torch.optim.AdamW):  # a subclass is untested, as in DeepSpeed (it matches the exact type)
        pass

    def build(make, stage, **extra):
        model = build_model()
        return initialize(model=model, optimizer=make([p for p in model.parameters() if p.requires_grad]),
                          config={"train_batch_size": 2, "zero_optimization": {"stage": stage}, **extra})[0]

    sgd = OPTIMIZERS["sgd"]
    for stage in (1, 2, 3):
        with pytest.raises(ConfigError, match="zero_allow_untested_optimizer") as info:
            build(sgd, stage)
        assert info.value.key == "zero_allow_untested_optimizer" and "optimizer=SGD" in str(info.value)
        with pytest.raises(ConfigError, match="optimizer=MyAdamW"):
            build(lambda ps: MyAdamW(ps), stage)
        assert build(sgd, stage, zero_allow_untested_optimizer=True).optimizer.client.name == "SGD"
    assert build(sgd, 0).optimizer.client.name == "SGD"  # stage 0: any torch optimizer
    for make in (lambda ps: torch.optim.Adagrad(ps), lambda ps: DeepSpeedCPUAdagrad(ps), lambda ps: FusedLion(ps),
                 lambda ps: DeepSpeedCPULion(ps)):  # on DeepSpeed's list: no key needed
        assert build(make, 2).optimizer.client is not None
    for make in (lambda ps: torch.optim.AdamW(ps), lambda ps: torch.optim.Adam(ps), lambda ps: FusedAdam(ps),
                 lambda ps: DeepSpeedCPUAdam(ps)) * 2:  # zero_ref's own Adam step (also once torch has hooked the
        engine = build(make, 2)                          # class's step, at its second instance)
        assert engine.optimizer.client is None and engine.optimizer.buckets[0].partition.exp_avg is not None
    amsgrad = build(lambda ps: torch.optim.AdamW(ps, amsgrad=True), 1)  # a variant zero_ref's Adam lacks: its own
    assert amsgrad.optimizer.client.name == "AdamW" and amsgrad.get_mom() == [(0.9, 0.999)]
    assert build(sgd, 0).get_mom() == [0.0]  # no betas: 0.0, as DeepSpeed's _get_optimizer_param answers
    build(sgd, 0).save_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="holds SGD's optimizer state, this engine steps Adam"):
        build(lambda ps: torch.optim.AdamW(ps), 0).load_checkpoint(str(tmp_path))


def resume(rank, world, name, stage, ckpt, mode):
    """4 steps of a 4-sample global batch (2 per micro-batch) with a torch schedule on the client optimizer;
    ``mode``: "straight" (all 4), "save" (2, then a checkpoint), "load" (the checkpoint, then steps 3-4) or
    "weights" (as "load", without the optimizer's state).
    Returns the mean loss of each step this rank ran."""
    from zero_ref.ds import initialize
    model = build_model()
    opt = OPTIMIZERS[name](groups(model))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gas = 2 // world
    engine, *_ = initialize(model=model, optimizer=opt, lr_scheduler=sched, config={
        "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True})
    steps = {"straight": range(4), "save": range(2), "load": range(2, 4), "weights": range(2, 4)}[mode]
    if mode in ("load", "weights"):
        assert engine.load_checkpoint(ckpt, load_optimizer_states=mode == "load")[0] is not None
    losses = []
    for step in steps:
        total = 0.0
        for micro in range(gas):
            loss = engine(*micro_batch(step, micro, rank, world, gas))[1]
            engine.backward(loss)
            engine.step()
            total += loss.item() / gas
        losses.append(total)
    if mode == "save":
        engine.save_checkpoint(ckpt)
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("name,stage", [("sgd", 2), ("adagrad", 3), ("heavy-ball", 0)])
def test_a_checkpoint_keeps_the_client_optimizers_partitioned_state(tmp_path, name, stage):
    """Resume gives the losses of the run never interrupted, bit for bit; the same checkpoint loads at one rank
    (the per-element state is stored per parameter, so it reshards) and goes on as the two ranks did."""
    ckpt = str(tmp_path / "ckpt")
    straight = zero_ref.launch(resume, WORLD, name, stage, ckpt, "straight", timeout=300)
    zero_ref.launch(resume, WORLD, name, stage, ckpt, "save", timeout=300)
    resumed = zero_ref.launch(resume, WORLD, name, stage, ckpt, "load", timeout=300)
    assert [r[2:] for r in straight] == resumed
    # the state matters: the same weights with a fresh optimizer state give other losses
    fresh = zero_ref.launch(resume, WORLD, name, stage, ckpt, "weights", timeout=300)
    assert abs(fresh[0][1] - resumed[0][1]) > 1e-4, (fresh, resumed)
    one = zero_ref.launch(resume, 1, name, stage, ckpt, "load", timeout=300)[0]
    for got, want in zip(one, [sum(r[s] for r in straight) / WORLD for s in (2, 3)]):
        assert abs(got - want) <= 1e-6 * abs(want)
