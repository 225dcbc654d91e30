"""MoE with expert parallelism on real gloo ranks equals a single-process MoE holding every expert."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import zero_ref
from zero_ref import comm
from zero_ref.models import GPTConfig, make_batch
from zero_ref.parallel import moe
from zero_ref.parallel.groups import build_groups
from zero_ref.parallel.topology import Topology

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

CFG = GPTConfig(vocab_size=61, seq_len=8, d_model=16, n_heads=2, n_layers=2)
EXPERTS, K, CF, COEF = 4, 2, 1.0, 0.01  # capacity factor 1.0 with k=2: some tokens are dropped
MICRO, STEPS, LR = 2, 4, 1e-2


def build(ep_group=None):
    torch.manual_seed(0)
    full = moe.moe_gpt(CFG, EXPERTS, K, CF)
    if ep_group is None:
        return full
    model = moe.moe_gpt(CFG, EXPERTS, K, CF, ep_group=ep_group)
    full_state = full.state_dict()
    model.load_state_dict({k: full_state[k] for k in model.state_dict()})  # this rank's slice of the experts
    return model


def adamw(model):
    # eps 1e-6: see tests/zero_ref/cases.py (a near-zero gradient's Adam step is otherwise sign noise)
    return torch.optim.AdamW(model.parameters(), lr=LR, eps=1e-6, weight_decay=0.1, foreach=False)


def chunk(step, rank, world):
    idx, targets = make_batch(CFG, MICRO * world, seed=1000 + step)
    return idx[rank * MICRO:(rank + 1) * MICRO], targets[rank * MICRO:(rank + 1) * MICRO]


def train(rank, world, ep):
    pg = build_groups(Topology.for_world(world, ep=ep), axes=("dp", "ep", "edp"))
    model = build(pg.ep)
    opt = adamw(model)
    out = {}
    for step in range(STEPS):
        with comm.recording() as log:
            logits, loss = model(*chunk(step, rank, world))
            (loss + COEF * moe.aux_loss(model)).backward()
            moe.reduce_gradients(model, pg.edp, pg.dp)
        if step == 0:
            out["logits"] = logits.detach()
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
            out["records"] = [(r.op, r.group_size, r.bytes) for r in log.records]
            out["routing"] = [(m.routing.capacity, m.routing.dropped, m.routing.tokens_per_expert(EXPERTS))
                              for m in moe.moe_layers(model)]
        opt.step()
        opt.zero_grad()
    out["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    try:  # the bad split is refused on the real group
        moe.MoE(CFG, 3 * ep + 1, ep_group=pg.ep)
        out["error"] = None
    except ValueError as e:
        out["error"] = str(e)
    return out


def reference(world):
    """One process, every expert, the global batch: each rank's chunk is routed on its own (capacity
    is per rank) and the loss is the mean over chunks, which is what data parallelism averages."""
    model = build()
    opt = adamw(model)
    out = {"logits": [], "routing": []}
    for step in range(STEPS):
        total = 0
        for r in range(world):
            logits, loss = model(*chunk(step, r, world))
            total = total + (loss + COEF * moe.aux_loss(model)) / world
            if step == 0:
                out["logits"].append(logits.detach())
                out["routing"].append([(m.routing.capacity, m.routing.dropped, m.routing.tokens_per_expert(EXPERTS))
                                       for m in moe.moe_layers(model)])
        total.backward()
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    out["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def max_abs(a, b):
    return (a - b).abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("world,ep", [(2, 1), (2, 2), (4, 2), (4, 4)])
def test_expert_parallel_equals_single_process(world, ep):
    ref = reference(world)
    results = zero_ref.launch(train, world, ep, timeout=180, echo=False)
    for rank, res in enumerate(results):
        # Same routing, same capacity, same drops (drops do happen: capacity factor 1 with k = 2).
        assert res["routing"] == ref["routing"][rank]
        assert sum(d for _, d, _ in res["routing"]) > 0
        # Forward: the experts see the same rows, batched with other ranks' rows (the matmul may
        # block differently), hence a float32 rounding-level tolerance rather than bit equality.
        assert max_abs(res["logits"], ref["logits"][rank]) < 1e-5
        for name, g in res["grads"].items():
            assert max_abs(g, ref["grads"][name]) < 1e-6, name
        # After STEPS AdamW steps: |Δ| ≤ 1e-5, as the ZeRO tests (an Adam step is ≤ lr = 1e-2).
        for name, v in res["state"].items():
            assert max_abs(v, ref["state"][name]) < 1e-5, name
        # This rank holds exactly its slice of the experts and every dense parameter.
        mine = {n.split(".experts.")[1].split(".")[0] for n in res["state"] if ".experts." in n}
        first = (rank % ep) * EXPERTS // ep
        assert mine == {str(e) for e in range(first, first + EXPERTS // ep)}
        if ep > 1:
            assert f"num_experts={3 * ep + 1} is not divisible" in res["error"] and f"ep={ep}" in res["error"]


@pytest.mark.slow
def test_all_to_all_and_reduction_bytes_equal_the_theory():
    world, ep = 4, 2
    res = zero_ref.launch(train, world, ep, timeout=180, echo=False)[0]
    tokens = MICRO * CFG.seq_len
    cap = moe.capacity(tokens, EXPERTS, K, CF)
    assert cap == math.ceil(K * tokens * CF / EXPERTS) == 8
    layers = len(res["routing"])
    # Per MoE layer: dispatch + combine in forward, their transposes in backward, each moving the
    # whole padded (E, C, d) fp32 buffer, over the ep group.
    a2a = [(op, n, b) for op, n, b in res["records"] if op == "all_to_all"]
    assert a2a == [("all_to_all", ep, moe.dispatch_bytes(EXPERTS, cap, CFG.d_model))] * (4 * layers)
    assert moe.dispatch_bytes(EXPERTS, cap, CFG.d_model) == EXPERTS * cap * CFG.d_model * 4
    # Gradients: one all-reduce of every dense parameter over all ranks, one of this rank's experts over edp.
    model = moe.moe_gpt(CFG, EXPERTS, K, CF)
    dense, expert = moe.split_params(model)
    reduces = [(op, n, b) for op, n, b in res["records"] if op == "all_reduce"]
    assert reduces == [("all_reduce", world, 4 * sum(p.numel() for p in dense)),
                       ("all_reduce", world // ep, 4 * sum(p.numel() for p in expert) // ep)]


# ------------------------------------------------------------------ the gate, without processes

@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), e=st.integers(1, 8), k=st.integers(1, 3), cf=st.floats(0.1, 3.0), seed=st.integers(0, 99))
def test_gating_invariants(n, e, k, cf, seed):
    k = min(k, e)
    logits = torch.randn(n, e, generator=torch.Generator().manual_seed(seed))
    r = moe.top_k_gating(logits, k, cf)
    assert r.capacity == math.ceil(k * n * cf / e)
    counts = r.tokens_per_expert(e)
    assert max(counts) <= r.capacity and sum(counts) + r.dropped == n * k
    slots = r.slot[r.kept]
    assert len(set(slots.tolist())) == len(slots)  # no two kept rows share a slot
    assert ((slots // r.capacity) == r.expert[r.kept]).all()
    # first choices queue before second choices: if any second choice reached expert x, no first
    # choice for x was dropped
    for j in range(1, k):
        for x in r.expert[:, j][r.kept[:, j]].unique().tolist():
            assert r.kept[:, 0][r.expert[:, 0] == x].all()
    if k > 1:  # kept weights renormalise to 1
        has = r.kept.any(1)
        assert torch.allclose(r.weight[has].sum(1), torch.ones(int(has.sum())), atol=1e-6)
    assert (r.weight[~r.kept] == 0).all()
    assert 0 <= r.aux_loss.item() <= e + 1e-5  # E·Σ f·P ≤ E·max P ≤ E


def test_aux_loss_extremes():
    n, e = 64, 4
    round_robin = torch.arange(n).remainder(e).unsqueeze(1).eq(torch.arange(e))  # token t prefers expert t mod E
    uniform = moe.top_k_gating(round_robin * 1e-3, 1, 1.0)
    assert abs(uniform.aux_loss.item() - 1.0) < 1e-3  # balanced: f = P = 1/E → E·Σ 1/E² = 1
    collapsed = moe.top_k_gating(torch.tensor([[50.0, 0, 0, 0]]).repeat(n, 1), 1, 1.0)
    assert abs(collapsed.aux_loss.item() - e) < 1e-3  # everything to one expert → E
    assert collapsed.dropped == n - n // e  # capacity n/E: the rest is dropped


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="k must be"):
        moe.MoE(CFG, 4, k=5)
    with pytest.raises(ValueError, match="k must be"):
        moe.top_k_gating(torch.zeros(3, 2), 0, 1.0)
    with pytest.raises(ValueError, match="capacity_factor"):
        moe.MoE(CFG, 4, capacity_factor=0)
    with pytest.raises(ValueError, match="num_experts"):
        moe.MoE(CFG, 0)
    with pytest.raises(ValueError, match="dropout"):
        moe.moe_gpt(GPTConfig(vocab_size=61, seq_len=8, d_model=16, n_heads=2, n_layers=2, dropout=0.1), 4)
    with pytest.raises(ValueError, match="run a forward"):
        moe.aux_loss(moe.moe_gpt(CFG, 4))


def test_single_process_layer_matches_a_dense_loop():
    # The slot machinery equals the obvious loop: y_t = Σ_kept w · expert(x_t).
    torch.manual_seed(1)
    layer = moe.MoE(CFG, EXPERTS, K, capacity_factor=0.75)
    x = torch.randn(3, 8, CFG.d_model)
    y = layer(x)
    r, tokens = layer.routing, x.reshape(-1, CFG.d_model)
    expect = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        for j in range(K):
            if r.kept[t, j]:
                expect[t] += r.weight[t, j] * layer.experts[str(int(r.expert[t, j]))](tokens[t])
    assert r.dropped > 0 and torch.allclose(y.reshape(-1, CFG.d_model), expect, atol=1e-6)
