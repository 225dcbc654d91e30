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
