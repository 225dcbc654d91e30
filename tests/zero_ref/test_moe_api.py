"""zero_ref.ds.moe.layer.MoE against deepspeed.moe.layer.MoE: the same weights and inputs give the same output,
l_aux, expert counts and gradients (fp32, 1e-6), at ep_size 1 and 2 on 2 gloo ranks.

Each case builds both layers from one seed (their parameters are equal, under the same names) and seeds
the random draws of the routing (DeepSpeed's random token selection for top-1, its Gumbel sampling of the
second expert for top-2) the same way before each forward. The capacity factors are small enough that
experts overflow, so the cases check which tokens are dropped, not only the arithmetic.
"""
import os

import pytest
import torch
import torch.nn as nn

import zero_ref

CASES = [dict(k=1, capacity_factor=1.0), dict(k=1, capacity_factor=1.0, use_rts=False),
         dict(k=1, capacity_factor=2.0, min_capacity=0, drop_tokens=False),
         dict(k=2, capacity_factor=0.5), dict(k=2, capacity_factor=1.0, top2_2nd_expert_sampling=False),
         dict(k=2, drop_tokens=False, eval_capacity_factor=3.0)]


def expert():
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))


def run(which: str, rank: int, ep_size: int, case: dict, train: bool = True) -> dict:
    if which == "deepspeed":
        from deepspeed.moe.layer import MoE
    else:
        from zero_ref.ds.moe.layer import MoE
    torch.manual_seed(0)
    moe = MoE(hidden_size=8, expert=expert(), num_experts=4, ep_size=ep_size, **case)
    if which == "deepspeed":
        moe.set_deepspeed_parallelism()
    moe.train(train)
    x = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(10 + rank), requires_grad=True)
    torch.manual_seed(1)  # the routing's random draws
    out, l_aux, counts = moe(x)
    (out.square().sum() + 0.1 * l_aux).backward()
    return dict(out=out.detach(), l_aux=l_aux.item(), counts=counts.tolist(), x_grad=x.grad,
                params={n: p.detach().clone() for n, p in moe.named_parameters()},
                grads={n: p.grad.clone() for n, p in moe.named_parameters() if p.grad is not None})


def both(rank, world):
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    out = {}
    for ep in (1, 2):
        for i, case in enumerate(CASES):
            out[(ep, i)] = {w: run(w, rank, ep, case) for w in ("zero_ref", "deepspeed")}
        out[(ep, "eval")] = {w: run(w, rank, ep, CASES[-1], train=False) for w in ("zero_ref", "deepspeed")}
    return out


@pytest.fixture(scope="module")
def runs():
    return zero_ref.launch(both, 2, timeout=600, echo=False)


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.parametrize("ep_size", [1, 2])
@pytest.mark.parametrize("case", list(range(len(CASES))) + ["eval"])
def test_moe_layer_equals_deepspeeds(runs, ep_size, case):
    dropped_somewhere = False
    for res in runs:
        ours, theirs = res[(ep_size, case)]["zero_ref"], res[(ep_size, case)]["deepspeed"]
        assert ours["params"].keys() == theirs["params"].keys()
        for n, p in theirs["params"].items():
            assert torch.equal(ours["params"][n], p), n  # built alike from one seed
        assert ours["counts"] == theirs["counts"]
        assert ours["l_aux"] == pytest.approx(theirs["l_aux"], rel=1e-6)
        torch.testing.assert_close(ours["out"], theirs["out"], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ours["x_grad"], theirs["x_grad"], rtol=1e-6, atol=1e-6)
        assert ours["grads"].keys() == theirs["grads"].keys()
        for n, g in theirs["grads"].items():
            torch.testing.assert_close(ours["grads"][n], g, rtol=1e-6, atol=1e-6, msg=n)
        dropped_somewhere |= bool((ours["out"].abs().sum(-1) == 0).any())
    if case in (0, 1, 3):  # capacity below the load: some token lost every choice and passes through as zeros
        assert dropped_somewhere


def test_split_params_into_moe_groups_as_deepspeed(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    ds_utils = pytest.importorskip("deepspeed.moe.utils")
    from zero_ref.ds.moe.utils import split_params_into_different_moe_groups_for_optimizer as split
    from zero_ref.ds.moe.layer import MoE
    moe = MoE(hidden_size=8, expert=expert(), num_experts=2)
    model = nn.Sequential(nn.Linear(8, 8), moe)
    groups = []
    for fn in (split, ds_utils.split_params_into_different_moe_groups_for_optimizer):
        got = fn([{"name": "decay", "params": list(model.parameters()), "weight_decay": 0.1}], max_group_size=200)
        groups.append([(g["name"], g.get("moe", False), g["weight_decay"], [id(p) for p in g["params"]]) for g in got])
    assert groups[0] == groups[1]
    assert groups[0][0][:2] == ("decay", False) and len(groups[0][0][3]) == 3  # Linear weight, bias, gate
    assert {g[:3] for g in groups[0][1:]} == {("ep_size_1", True, 0.1)} and len(groups[0]) > 2  # chunks of <= 200


def test_the_engine_trains_an_ep1_moe_and_refuses_ep2(one_thread):
    """At ep_size 1 the engine trains the layer (l_aux in the loss); ep_size > 1 is refused by name."""
    import torch.distributed as dist
    from zero_ref.ds.moe.layer import MoE
    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    try:
        torch.manual_seed(0)
        model = MoE(hidden_size=8, expert=expert(), num_experts=2, k=2, top2_2nd_expert_sampling=False)
        engine, *_ = zero_ref.initialize(model=model, config={"train_batch_size": 1, "optimizer": {
            "type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 1}})
        x = torch.randn(4, 5, 8, generator=torch.Generator().manual_seed(0))
        losses = []
        for _ in range(5):
            out, l_aux, _ = engine(x)
            loss = (out - x).square().mean() + 0.01 * l_aux
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0]
        model.ep_size = 2  # as a layer built with ep_size=2 would say
        with pytest.raises(ValueError, match="ep_size=2 is not supported by zero_ref's engine"):
            zero_ref.initialize(model=model, config={"train_batch_size": 1, "optimizer": {"type": "AdamW"}})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.update(env)
