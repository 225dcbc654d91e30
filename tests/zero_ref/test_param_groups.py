"""Param groups with their own hyper-parameters (DeepSpeed's ``model_parameters`` groups, a client
optimizer's groups): every stage, with and without offload, steps each group with its own lr, betas,
eps and weight decay, and equals torch.optim.AdamW given the same groups.

The groups are the usual ones of HF / DeepSpeed-Chat scripts (weight decay on matrices, none on biases
and norms) with, on top, a different lr and betas for the second group. Buckets of 300 elements mix the
groups, and shards split parameters, so a run of the optimizer state can change group mid-shard.
"""
import pytest
import torch

import zero_ref
from zero_ref.stages.flat import FlatLayout
from zero_ref.optim import AdamConfig
from zero_ref.stages.param_groups import param_groups_for
from tests.zero_ref.cases import ADAM, build_model, micro_batch, make_batch, CFG, MICRO_BATCH

STEPS = 3
NO_DECAY = {"weight_decay": 0.0, "lr": 2 * ADAM.lr, "betas": (0.8, 0.99)}


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def groups_of(model) -> list[dict]:
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if p.dim() >= 2]},  # the defaults (ADAM's values)
            {"params": [p for p in trainable if p.dim() < 2], **NO_DECAY}]


def reference(world: int, grouped: bool = True) -> dict:
    """Single-process torch.optim.AdamW on the whole batch, with the groups (or one group of everything)."""
    model = build_model()
    params = groups_of(model) if grouped else [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps, weight_decay=ADAM.weight_decay,
                            foreach=False)
    for step in range(STEPS):
        _, loss = model(*make_batch(CFG, MICRO_BATCH * world, seed=1000 + step))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(rank, world, stage, kw):
    from zero_ref.stages import STAGES
    model = build_model()
    opt = STAGES[stage](model, adam=ADAM, reduce_bucket_size=300, param_groups=groups_of(model), **kw)
    assert [g["weight_decay"] for g in opt.param_groups] == [ADAM.weight_decay, 0.0]
    assert len({g for b in opt.buckets for _, _, g in b.adam_runs}) == 2  # both groups are stepped
    for step in range(STEPS):
        _, loss = model(*micro_batch(step, 0, rank, world, 1))
        opt.backward(loss)
        assert opt.step()
    if stage == 3:
        with zero_ref.stages.zero3.GatheredParameters(list(model.parameters())):
            return {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


CASES = [(0, {}), (1, {}), (2, {}), (3, {"param_persistence_threshold": 0}),
         (2, {"offload_optimizer": {"device": "cpu"}}), (3, {"offload_optimizer": {"device": "cpu"},
                                                              "param_persistence_threshold": 0})]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("stage, kw", CASES, ids=["z0", "z1", "z2", "z3", "z2-offload", "z3-offload"])
def test_each_group_steps_with_its_own_values(stage, kw, world):
    ref = reference(world)
    plain = reference(world, grouped=False)
    for state in zero_ref.launch(train, world, stage, kw, timeout=120):
        for k in ref:
            diff = (state[k] - ref[k]).abs().max().item()
            # one rank adds in the reference's order; two add the ranks' halves (see test_zero_stages)
            assert diff <= (0 if world == 1 and not kw else 1e-5), f"{k}: max |Δ| = {diff:.3g}"
        # the groups matter: one group with the defaults ends far from it
        assert max((plain[k] - ref[k]).abs().max().item() for k in ref) > 1e-3


def test_runs_follow_the_groups_through_shards_and_padding():
    layout = FlatLayout([(3,), (4,), (2,)], world_size=2)  # 9 elements + 1 padding = 2 × 5
    labels = ["a", "b", "b"]
    assert layout.runs(labels) == [(0, 3, "a"), (3, 10, "b")]          # the whole buffer; padding joins "b"
    assert layout.runs(labels, 0) == [(0, 3, "a"), (3, 5, "b")]        # shard 0: all of p0, 2 of p1
    assert layout.runs(labels, 1) == [(0, 5, "b")]                     # shard 1: rest of p1, p2, padding
    assert layout.runs(["a", "b", "a"], 1) == [(0, 2, "b"), (2, 5, "a")]
    tiny = FlatLayout([(1,)], world_size=4)                            # shards 1-3 hold padding only
    assert tiny.runs(["x"], 3) == [(0, 1, "x")]
    with pytest.raises(ValueError, match="expected 3 labels"):
        layout.runs(["a"])


def test_groups_fill_in_defaults_and_bad_groups_are_refused():
    model = build_model()
    groups, group_of = param_groups_for(model, groups_of(model), ADAM)
    assert groups[0]["lr"] == ADAM.lr and groups[0]["betas"] == ADAM.betas and groups[1]["betas"] == (0.8, 0.99)
    assert len(group_of) == sum(p.requires_grad for p in model.parameters())
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = model.pos_emb.weight
    for bad, match in (([{"params": trainable}, {"params": trainable[:1]}], "also in group 0"),
                       ([{"params": trainable[1:]}], "1 missing"),
                       ([{"params": trainable + [frozen]}], "1 not trainable"),
                       ([{"params": trainable, "amsgrad": True}], "amsgrad=True is not supported"),
                       ([{"params": trainable, "lr": -1.0}], "invalid Adam hyper-parameter lr"),
                       ({"params": trainable}, "a list of dicts")):
        with pytest.raises(ValueError, match=match):
            param_groups_for(model, bad, AdamConfig())
