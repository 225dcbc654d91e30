"""Pipeline parallelism on real gloo ranks: schedules, partitioning, equality with one process, errors."""
import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

import zero_ref
from zero_ref.models import GPT, GPTConfig, make_batch
from zero_ref.parallel.pipeline import Pipeline, measured_bubble, partition, split_gpt
from zero_ref.parallel.schedules import check_schedule, stage_order
from tests.zero_ref.cases import max_diff

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

# Tiny and awkward: an odd vocabulary, biases, a frozen position embedding; tied or untied head.
TIED = GPTConfig(vocab_size=97, seq_len=8, d_model=24, n_heads=3, n_layers=4)
UNTIED = GPTConfig(vocab_size=97, seq_len=8, d_model=24, n_heads=3, n_layers=4, tie_embeddings=False)
# eps = 1e-6: see tests/zero_ref/cases.py (a ~0 gradient would otherwise turn rounding noise into ±lr steps)
ADAMW = dict(lr=1e-2, weight_decay=0.1, eps=1e-6, foreach=False)
STEPS, BATCH = 3, 8


def build(cfg):
    torch.manual_seed(0)
    model = GPT(cfg)
    model.pos_emb.weight.requires_grad_(False)
    return model


def batches(cfg, step, m):
    idx, targets = make_batch(cfg, BATCH, seed=100 + step)
    return list(zip(idx.chunk(m), targets.chunk(m)))


def reference(cfg, m=1, reverse=False):
    """One process, AdamW. m = 1: the whole global batch at once; m > 1: the same m micro-batches
    accumulated (loss / m each), in reverse for GPipe, whose backwards run last micro-batch first."""
    model = build(cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **ADAMW)
    for step in range(STEPS):
        mbs = batches(cfg, step, m)
        for idx, targets in (mbs[::-1] if reverse else mbs):
            (model(idx, targets)[1] / m).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(rank, world, cfg, schedule, virtual, m):
    chunks = split_gpt(build(cfg), world * virtual)[rank::world]
    pipe = Pipeline(chunks, rank, list(range(world)), schedule=schedule, microbatches=m)
    opt = torch.optim.AdamW([p for c in chunks for p in c.parameters() if p.requires_grad], **ADAMW)
    for step in range(STEPS):
        stats = pipe.train_step(batches(cfg, step, m))
        opt.step()
        opt.zero_grad()
    state = {}
    for c in chunks:
        state.update({k: v.detach().clone() for k, v in c.gpt_state_dict().items()})
    return state, stats


def worst_diff(states, ref):
    """The largest |Δ| of any rank's state against ``ref``."""
    return max(max_diff(s, ref) for s in states)


# ----------------------------------------------------------------------- schedules (no processes)

@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), v=st.integers(1, 3),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]))
def test_every_schedule_does_the_same_work_once_each(p, m, v, schedule):
    """Each stage's order (the one zero_ref runs and sim times: both read zero_ref.parallel.schedules; that the runner
    executes it is checked on real ranks below) holds every forward and backward once, F before B."""
    try:
        check_schedule(schedule, p, m, v)
    except ValueError:
        with pytest.raises(ValueError):
            stage_order(schedule, p, m, 0, v)
        return
    for s in range(p):
        order = stage_order(schedule, p, m, s, v)
        assert sorted(order) == sorted(itertools.product("BF", range(m), range(v)))  # v·m F and v·m B
        assert all(order.index(("F", i, c)) < order.index(("B", i, c)) for i in range(m) for c in range(v))


def test_schedule_preconditions_are_clear_errors():
    with pytest.raises(ValueError, match=r"micro-batches \(2\) to be a multiple of the number of stages \(4\)"):
        check_schedule("interleaved", 4, 2, 2)  # fewer micro-batches than stages: Megatron refuses
    with pytest.raises(ValueError, match="multiple of the number of stages"):
        check_schedule("interleaved", 4, 6, 2)
    with pytest.raises(ValueError, match="need schedule='interleaved'"):
        check_schedule("1f1b", 4, 8, 2)
    with pytest.raises(ValueError, match="schedule must be one of"):
        check_schedule("zigzag", 4, 8)
    check_schedule("1f1b", 4, 2)   # GPipe and 1F1B run m < p (mostly bubble, still correct: see below)
    check_schedule("gpipe", 4, 1)


# ----------------------------------------------------------------------- partitioning

@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.integers(0, 9), min_size=1, max_size=8), parts=st.integers(1, 4))
def test_partition_is_contiguous_and_optimal(costs, parts):
    if parts > len(costs):
        with pytest.raises(ValueError, match="cannot be split"):
            partition(costs, parts)
        return
    ranges = partition(costs, parts)
    assert [i for r in ranges for i in r] == list(range(len(costs))) and all(len(r) for r in ranges)
    best = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, len(costs))))
               for cuts in itertools.combinations(range(1, len(costs)), parts - 1))
    assert max(sum(costs[i] for i in r) for r in ranges) == best  # brute force agrees


def test_split_gpt_balances_and_refuses_layers_that_do_not_split():
    model = build(UNTIED)
    assert [(s.lo, s.hi) for s in split_gpt(model, 4)] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert [(s.lo, s.hi) for s in split_gpt(model, 2, costs=[1, 1, 1, 5])] == [(0, 3), (3, 4)]
    stages = split_gpt(model, 2)
    assert stages[0].is_first and stages[1].is_last and not stages[0].is_last
    with pytest.raises(ValueError, match="4 layers cannot be split into 5 stages"):
        split_gpt(model, 5)
    with pytest.raises(ValueError, match="one number per block"):
        split_gpt(model, 2, costs=[1, 2])
    tied = split_gpt(build(TIED), 2)  # the last stage gets its own copy of the word embedding
    assert tied[1].head.weight is not tied[0].tok_emb.weight
    assert torch.equal(tied[1].head.weight, tied[0].tok_emb.weight)


# ----------------------------------------------------------------------- real ranks

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2))


def _all_schedules(rank, world):
    return [train(rank, world, UNTIED, s, v, 4) for s, v in SCHEDULES]


@pytest.mark.slow
def test_two_stages_every_schedule_equals_one_process():
    """Untied weights: bit for bit equal to one process accumulating the same micro-batches in the
    same order (each op is the same op; .grad sums in the same order). Against the whole batch at
    once the gradient adds in another order: 3 AdamW steps agree to 1e-5."""
    results = zero_ref.launch(_all_schedules, 2, timeout=180)
    whole = reference(UNTIED)
    for k, (schedule, v) in enumerate(SCHEDULES):
        ran = [[(o.kind, o.microbatch, o.chunk) for o in r[k][1].ops] for r in results]
        assert ran == [stage_order(schedule, 2, 4, rank, v) for rank in range(2)], schedule  # the order sim times
        states = [r[k][0] for r in results]
        assert set(states[0]) | set(states[1]) == set(whole)  # the two stages hold the whole model
        assert worst_diff(states, reference(UNTIED, 4, reverse=schedule == "gpipe")) == 0, schedule
        assert worst_diff(states, whole) <= 1e-5, schedule


def _four_stages(rank, world):
    return [train(rank, world, TIED, s, 1, m) for s, m in (("1f1b", 4), ("gpipe", 2))]


@pytest.mark.slow
def test_four_stages_tied_embeddings_and_fewer_microbatches_than_stages():
    """Tied embeddings across stage 0 and 3 (gradients summed between them); 1F1B with m = 4 and
    GPipe with m = 2 < p = 4 (allowed, correct, mostly bubble)."""
    results = zero_ref.launch(_four_stages, 4, timeout=240)
    whole = reference(TIED)
    for k in range(2):
        states = [r[k][0] for r in results]
        assert worst_diff(states, whole) <= 1e-5
        assert torch.equal(states[0]["tok_emb.weight"], states[3]["head.weight"])  # the copies stay equal
        stats = [r[k][1] for r in results]
        assert all(s.stage == i for i, s in enumerate(stats))
        assert 0 < measured_bubble(stats) < 1
    one_f_one_b, gpipe = ([r[k][1] for r in results] for k in range(2))
    assert [s.peak_in_flight for s in one_f_one_b] == [4, 3, 2, 1]  # 1F1B holds p − s micro-batches
    assert [s.peak_in_flight for s in gpipe] == [2, 2, 2, 2]        # GPipe holds all m
    assert results[-1][0][1].loss is not None and results[0][0][1].loss is None


def _mismatched(rank, world):
    chunks = split_gpt(build(UNTIED), world)[rank::world]
    pipe = Pipeline(chunks, rank, list(range(world)), microbatches=2)
    idx, targets = make_batch(UNTIED, 4 if rank == 0 else 6, seed=0)  # the stages disagree on the batch
    pipe.train_step(list(zip(idx.chunk(2), targets.chunk(2))))


@pytest.mark.slow
def test_mismatched_shapes_are_an_error_not_a_hang():
    # Each stage checks its neighbour's shapes; whichever raises first fails the launch.
    with pytest.raises(zero_ref.RankError, match=r"stage \d has micro-batches \(batch, seq\), m, hidden = "
                                                 r"\[\d, 8, 2, 24\] but stage \d has \[\d, 8, 2, 24\]"):
        zero_ref.launch(_mismatched, 2, timeout=60)


# ----------------------------------------------------------------------- zero bubble (ZB-H1)

def in_flight(order):
    """The most micro-batches whose activations a stage holds at once: from its F to its last backward op."""
    last = "W" if any(k == "W" for k, _, _ in order) else "B"
    held = peak = 0
    for kind, _, _ in order:
        held += (kind == "F") - (kind == last)
        peak = max(peak, held)
    return peak


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 16))
def test_zb_h1_orders(p, m):
    """Each stage runs every micro-batch's F, B and W once, W after its B; stage s defers s W to the
    end; no stage holds more micro-batches than 1F1B's stage 0 (min(p, m)), 1F1B's own bound."""
    for s in range(p):
        order = stage_order("zb-h1", p, m, s)
        assert sorted(order) == sorted(itertools.product("BFW", range(m), [0]))
        assert all(order.index(("F", i, 0)) < order.index(("B", i, 0)) < order.index(("W", i, 0)) for i in range(m))
        without_w = [op for op in order if op[0] != "W"]
        assert without_w == stage_order("1f1b", p, m, s)  # F and B in 1F1B's order
        assert order[len(order) - min(s, m):] == [("W", i, 0) for i in range(m - min(s, m), m)]
        assert in_flight(order) <= max(in_flight(stage_order("1f1b", p, m, t)) for t in range(p)) == min(p, m)


def test_zb_h1_order_is_torchs():
    """torch 2.13's zero-bubble order builder (schedules.py, _get_1f1b_rank_ops with enable_zero_bubble=True,
    as ScheduleInterleavedZeroBubble calls it: warm-up p − 1 − rank, num_1f1b_microbatches = rank), run with
    one stage per rank, gives the same F / I / W order (its I is our B)."""
    from torch.distributed.pipelining.schedules import _get_1f1b_rank_ops
    for p, m in itertools.product(range(1, 7), range(1, 13)):
        for r in range(p):
            w = min(p - r - 1, m)
            ops = _get_1f1b_rank_ops(1, p, w, m - w, w, r, lambda _: r, lambda _: r, r, enable_zero_bubble=True)
            theirs = [({"F": "F", "I": "B", "W": "W"}[a.computation_type.value], a.microbatch_index, 0)
                      for a in ops if a is not None]
            assert theirs == stage_order("zb-h1", p, m, r), (p, m, r)


def grads_of(rank, world, cfg, schedule, m):
    """One pipeline step's loss and every parameter's gradient on this rank."""
    chunks = split_gpt(build(cfg), world)[rank::world]
    stats = Pipeline(chunks, rank, list(range(world)), schedule=schedule, microbatches=m).train_step(batches(cfg, 0, m))
    grads = {k: t.grad.clone() for c in chunks for k, t in c.gpt_state_dict(keep_vars=True).items() if t.grad is not None}
    return stats, grads


def _zb_runs(rank, world, cfg, ms):
    return [(train(rank, world, cfg, "zb-h1", 1, m), grads_of(rank, world, cfg, "zb-h1", m),
             grads_of(rank, world, cfg, "1f1b", m)) for m in ms]


def one_process_grads(cfg, m):
    model = build(cfg)
    losses = []
    for idx, targets in batches(cfg, 0, m):
        loss = model(idx, targets)[1]
        losses.append(loss.item())
        (loss / m).backward()
    return losses, {k: v.grad for k, v in model.named_parameters() if v.grad is not None}


def check_zb(results, cfg, ms, world):
    for k, m in enumerate(ms):
        (states, zb, ofob) = ([r[k][0][0] for r in results], [r[k][1] for r in results], [r[k][2] for r in results])
        ran = [[(o.kind, o.microbatch, o.chunk) for o in r[k][0][1].ops] for r in results]
        assert ran == [stage_order("zb-h1", world, m, s) for s in range(world)], m  # the order sim times
        assert worst_diff(states, reference(cfg, m)) <= 1e-6, m          # 3 AdamW steps as one process, accumulated
        assert worst_diff(states, reference(cfg)) <= 1e-5, m              # ... and on the whole batch
        want_losses, want = one_process_grads(cfg, m)
        assert zb[-1][0].losses == pytest.approx(want_losses, rel=1e-6, abs=0)
        grads = {key: g for _, gs in zb for key, g in gs.items()}
        assert set(grads) == set(want) | ({"head.weight"} if cfg.tie_embeddings else set()), m
        for key, g in grads.items():
            ref = want[key if key in want else "tok_emb.weight"]  # the tied head: the embedding's gradient
            assert (g - ref).abs().max() <= 1e-6 * ref.abs().max(), (m, key)       # fp32, 1e-6 of the largest entry
        for (_, a), (_, b) in zip(zb, ofob):                                       # 1F1B's, to the bit
            assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a), m


@pytest.mark.slow
def test_zb_h1_two_stages_equals_one_process_and_1f1b():
    """Two stages (untied), m = 1, 2, 4, 8: B passes only input gradients, W the weights' later. Every gradient
    equals 1F1B's to the bit (each weight gradient is the same GEMM, accumulated in the same micro-batch order)
    and one process's to 1e-6 of the tensor's largest entry (fp32; measured: equal to the bit untied, 9e-8 tied,
    where the tied copies are summed in another order); the losses to 1e-6 relative."""
    ms = (1, 2, 4, 8)
    check_zb(zero_ref.launch(_zb_runs, 2, UNTIED, ms, timeout=240), UNTIED, ms, 2)


@pytest.mark.slow
def test_zb_h1_four_stages_tied_equals_one_process():
    """Four stages with the word embedding tied between stages 0 and 3; m = 2 (< p), 4 and 8. Every stage
    holds at most p micro-batches: 1F1B's peak (stage 0's), reached on every stage once m ≥ p."""
    ms = (2, 4, 8)
    results = zero_ref.launch(_zb_runs, 4, TIED, ms, timeout=300)
    check_zb(results, TIED, ms, 4)
    for k, m in enumerate(ms):
        peaks = [r[k][0][1].peak_in_flight for r in results]
        assert peaks == [in_flight(stage_order("zb-h1", 4, m, s)) for s in range(4)] and max(peaks) == min(4, m)


SPLIT_BY_TP = GPTConfig(vocab_size=96, seq_len=8, d_model=16, n_heads=2, n_layers=4, tie_embeddings=False)


def _zb_3d(rank, world, runs):
    from zero_ref.optim import AdamConfig
    from zero_ref.parallel.groups import build_groups
    from zero_ref.parallel.topology import Topology
    from zero_ref.recipes.three_d import ThreeD

    adam = AdamConfig(lr=ADAMW["lr"], weight_decay=ADAMW["weight_decay"], eps=ADAMW["eps"])
    out = []
    for tp, dp in runs:
        groups, ran = build_groups(Topology(tp=tp, pp=2, dp=dp)), {}
        for schedule in ("zb-h1", "1f1b"):
            trainer = ThreeD(build(SPLIT_BY_TP), groups, microbatches=2, schedule=schedule, adam=adam)
            for step in range(STEPS):
                stats, _ = trainer.train_step(*make_batch(SPLIT_BY_TP, BATCH, seed=100 + step))
            ran[schedule] = (trainer, stats)
        (zb, stats), (ofob, _) = ran["zb-h1"], ran["1f1b"]
        same = all(torch.equal(a, b) for (_, a), (_, b) in zip(zb.named_parameters(), ofob.named_parameters()))
        out.append((zb.max_diff(reference(SPLIT_BY_TP)), same, stats.sync, [o.kind for o in stats.ops]))
    return out


@pytest.mark.slow
def test_zb_h1_with_data_and_tensor_parallelism():
    """ZB-H1 inside 3D on 4 ranks: pp = 2 × dp = 2 with ZeRO-1 (the gradients reduced after the schedule, as the
    last op is a W), and pp = 2 × tp = 2 (the TP all-reduces of the backward run in B). Three AdamW steps
    equal to 1F1B's 3D run to the bit, and within 1e-4 of one process on the whole batch (the bound and its reason:
    tests/zero_ref/test_three_d.py)."""
    for diff, same, sync, kinds in (r for rank in zero_ref.launch(_zb_3d, 4, [(1, 2), (2, 1)], timeout=240) for r in rank):
        assert same and diff <= 1e-4 and sync == "after schedule" and kinds.count("W") == 2
