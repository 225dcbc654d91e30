"""ZeRO-3 on real gloo ranks: equals single-process AdamW; memory, communication and zero.Init measured.

Units of the toy model (tests/zero_ref/cases.py): one per module with parameters, 15 in all; the tied
head/tok_emb weight is one unit (tok_emb's), which head's forward gathers too; pos_emb is frozen.
"""
import time

import pytest
import torch

from tests.zero_ref import test_zero_stages as zs
import zero_ref
from zero_ref import comm
from zero_ref.stages.flat import FlatLayout
from zero_ref.measure import PeakTensorBytes, unique_storage_bytes
from zero_ref.memory import model_state_bytes
from zero_ref.models import GPT, GPTConfig
from zero_ref.precision import DynamicLossScaler
from zero_ref.stages import ZeroStage2, ZeroStage3
from zero_ref.stages.zero3 import GatheredParameters, Init, unit_of
from zero_ref.models import Block
from tests.zero_ref.cases import ADAM, CFG, build_model, micro_batch, reference_params

STEPS = zs.STEPS
pytestmark = pytest.mark.usefixtures("one_thread")  # the reference runs one intra-op thread, like the ranks
ALL_PARTITIONED = dict(param_persistence_threshold=0)  # the default 1e5 would keep every toy unit whole
CONFIGS = {
    "default": {},                                      # prefetch_bucket_size 5e7: all units prefetched
    "no_prefetch": dict(prefetch_bucket_size=0),
    "tiny_live": dict(max_live_parameters=1),           # one unit gathered at a time
    "persistent": dict(param_persistence_threshold=100),  # the LayerNorm units (48 elements) stay whole
    "gas2": dict(gradient_accumulation_steps=2),
    "per_block": dict(unit_modules=(Block,)),           # a block's whole subtree is one unit (FSDP-style)
    "reuse": dict(max_reuse_distance=int(1e9)),         # DeepSpeed's default: gathered from forward to backward
    "unbucketed": dict(reduce_bucket_size=1),           # one reduce-scatter per unit
}


def train(rank, world, model, opt, gas=1):
    """STEPS optimizer steps; returns the comm records of the last step as (op, dtype, bytes)."""
    for step in range(STEPS):
        with comm.recording() as log:
            for micro in range(gas):
                idx, targets = micro_batch(step, micro, rank, world, gas)
                _, loss = model(idx, targets)
                opt.backward(loss)
                assert opt.step() == (micro == gas - 1)
    return [(r.op, r.dtype, r.bytes) for r in log.records]


def run_configs(rank, world):
    out = {}
    for name, kw in CONFIGS.items():
        model = build_model()
        opt = ZeroStage3(model, adam=ADAM, **{**ALL_PARTITIONED, **kw})
        records = train(rank, world, model, opt, gas=kw.get("gradient_accumulation_steps", 1))
        units, part = opt.units, [u.unit.part for u in opt.units]
        assert all(p.grad is None and (p.numel() == 0) != u.persistent for u in units for p in u.params)
        memory = {"params": unique_storage_bytes(part + [p.data for p in model.parameters()]),
                  "grads": unique_storage_bytes([b.partition.grad for b in opt.buckets]),
                  "optimizer": unique_storage_bytes([t for b in opt.buckets for t in b.partition.optimizer_tensors()],
                                                    exclude=part)}
        layout = [dict(name=u.name, numel=u.numel, shard=u.layout.shard_numel, size=u.size, persistent=u.persistent,
                       trainable=u.params[0].requires_grad) for u in units]
        out[name] = dict(state=opt.state_dict(), records=records, memory=memory, units=layout,
                         peak_live=opt.peak_live_numel, expects_order=opt.path.expected is not None,
                         groups=len(opt.reduce_groups))
    model = build_model()
    out["stage2"] = dict(records=train(rank, world, model, ZeroStage2(model, adam=ADAM)))
    return out


@pytest.fixture(scope="module", params=[1, 2, 4])
def runs(request):
    world = request.param
    return world, zero_ref.launch(run_configs, world, timeout=120)


def total(units, key, **where):
    return sum(u[key] for u in units if all(u[k] == v for k, v in where.items()))


@pytest.mark.slow
def test_equals_single_process_adamw(runs):
    world, results = runs
    ref, ref_gas2 = reference_params(STEPS, world, gas=1), reference_params(STEPS, world, gas=2)
    for res in results:
        state = res["default"]["state"]
        if world == 1:
            assert zs.max_diff(state, ref) == 0  # bit for bit
        else:
            zs.assert_close_to_reference(state, ref, atol=1e-5)
        zs.assert_close_to_reference(res["gas2"]["state"], ref_gas2, atol=1e-5)  # GAS 2 = one 2×-sized batch
        assert len(res["per_block"]["units"]) < len(res["default"]["units"])
        zs.assert_close_to_reference(res["per_block"]["state"], ref, atol=1e-5)
        for name in ("no_prefetch", "tiny_live", "persistent", "reuse"):  # the knobs move bytes, never values
            assert zs.max_diff(res[name]["state"], state) == 0, name
        zs.assert_close_to_reference(res["unbucketed"]["state"], ref, atol=1e-5)  # (other sums: other roundings)
    for res in results[1:]:  # every rank ends with the same full parameters
        assert all(zs.max_diff(results[0][n]["state"], res[n]["state"]) == 0 for n in CONFIGS)
    first = results[0]
    assert first["reuse"]["peak_live"] == total(first["reuse"]["units"], "size", persistent=False)  # all at once
    assert first["tiny_live"]["peak_live"] == max(u["size"] for u in first["tiny_live"]["units"])  # one at a time
    assert first["no_prefetch"]["peak_live"] < first["default"]["peak_live"]


@pytest.mark.slow
def test_memory_per_rank_at_rest(runs):
    """params = padded Ψ/N (+ persistent units, whole); grads = Ψ/N; Adam = 8Ψ/N (fp32: the partition is the master)."""
    world, results = runs
    for name in ("default", "persistent"):
        units, measured = results[0][name]["units"], results[0][name]["memory"]
        psi, psi_t = total(units, "numel"), total(units, "numel", trainable=True)  # frozen pos_emb: no grads, Adam
        pad = total(units, "shard") - -(-psi // world)  # each unit pads to a multiple of N on its own
        pad_t = total(units, "shard", trainable=True) - -(-psi_t // world)
        whole = total(units, "size", persistent=True)
        formula, formula_t = (model_state_bytes(n, zero_stage=3, dp=world, precision="fp32", padded=True)
                              for n in (psi, psi_t))
        assert 0 <= pad_t <= pad < len(units)  # < 1 element per rank per unit over ceil(Ψ/N)
        assert measured["params"] == formula.params + 4 * pad + 4 * whole
        assert measured["grads"] == formula_t.grads + 4 * pad_t
        assert measured["optimizer"] == formula_t.optimizer + 8 * pad_t
        assert (whole > 0) == (name == "persistent")


def step_bytes(records, op, dtype="float32"):
    return sum(b for o, d, b in records if o == op and d == dtype)


@pytest.mark.slow
def test_communication_per_step(runs):
    """Per step and rank: all-gather Ψ forward + Ψ backward + reduce-scatter Ψ = 1.5× ZeRO-2's 2Ψ, exactly up to
    the tied unit, the frozen embedding, persistent units, padding and the same-path header."""
    world, results = runs
    for name in ("default", "no_prefetch", "tiny_live", "persistent"):
        units, records = results[0][name]["units"], results[0][name]["records"]
        size = {u["name"]: u["size"] for u in units}
        gathered = total(units, "size", persistent=False)
        forward = gathered + size["tok_emb"]  # head gathers the tied unit a second time
        backward = gathered - size["pos_emb"]  # an embedding's backward reads only the indices
        after_step = total(units, "size", persistent=True, trainable=True)  # persistent units, updated
        assert step_bytes(records, "all_gather") == 4 * (forward + backward + after_step)
        assert step_bytes(records, "reduce_scatter") == 4 * total(units, "size", trainable=True)
        assert sum(o == "reduce_scatter" for o, _, _ in records) == 1  # the toy model's units: one bucket
        assert step_bytes(records, "all_reduce", "float64") == 16  # the global norm and overflow flag
        # The same-path check: by the last step the order of the step before is expected, and the ranks exchange
        # one 24-byte header (position, unit, op) per rank at the micro-step's end (none on one rank).
        assert step_bytes(records, "all_gather", "int64") == (24 * world if world > 1 else 0)
        assert results[0][name]["expects_order"] == (world > 1)
    units = results[0]["default"]["units"]
    size = {u["name"]: u["size"] for u in units}
    trainable = sum(u["trainable"] for u in units)
    # max_reuse_distance 1e9: each unit is gathered once, in forward (tied head included); backward gathers none
    reuse = results[0]["reuse"]["records"]
    after_step = total(units, "size", persistent=True, trainable=True)
    assert step_bytes(reuse, "all_gather") == 4 * (total(units, "size", persistent=False) + after_step)
    # reduce_bucket_size 1: one reduce-scatter per trainable unit, the same bytes as the one bucket
    unbucketed = results[0]["unbucketed"]
    assert unbucketed["groups"] == trainable and results[0]["default"]["groups"] == 1
    assert sum(o == "reduce_scatter" for o, _, _ in unbucketed["records"]) == trainable
    assert step_bytes(unbucketed["records"], "reduce_scatter") == step_bytes(results[0]["default"]["records"],
                                                                             "reduce_scatter")
    psi_t = total(units, "numel", trainable=True)
    data2 = step_bytes(results[0]["stage2"]["records"], "all_gather") + \
        step_bytes(results[0]["stage2"]["records"], "reduce_scatter")
    data3 = step_bytes(results[0]["default"]["records"], "all_gather") + \
        step_bytes(results[0]["default"]["records"], "reduce_scatter")
    assert data2 == 4 * 2 * -(-psi_t // world) * world  # ZeRO-2: one bucket, reduce-scattered + all-gathered
    # ZeRO-3: 3 × the trainable units, + tok_emb gathered again for head, + frozen pos_emb gathered in forward.
    assert data3 == 4 * (3 * total(units, "size", trainable=True) + size["tok_emb"] + size["pos_emb"])
    ratio = data3 / data2
    print(f"world {world}: ZeRO-3 {data3} B vs ZeRO-2 {data2} B per step and rank: {ratio:.4f}×")
    assert 1.5 <= ratio < 1.6


# ---------------------------------------------------------------- zero.Init, GatheredParameters, state_dict

BIG = GPTConfig(vocab_size=127, seq_len=16, d_model=63, n_heads=3, n_layers=6)  # 300k params; tok_emb is odd


def build_big():
    torch.manual_seed(0)
    return GPT(BIG)


def run_init(rank, world):
    out = {}
    with PeakTensorBytes() as whole:
        normal = build_big()
    with PeakTensorBytes() as parted:
        with Init():
            big = build_big()
    units = list(dict.fromkeys(unit_of(p) for p in big.parameters()))
    # GPT builds head with its own weight (partitioned like any other) before tying it to tok_emb's.
    replaced = FlatLayout([(BIG.vocab_size, BIG.d_model)], world)
    out["construction"] = dict(whole=whole.peak, parted=parted.peak, model=4 * sum(p.numel() for p in normal.parameters()),
                               shards=4 * sum(u.layout.shard_numel for u in units),
                               replaced=4 * replaced.shard_numel, units=len(units),
                               largest=4 * max(u.numel for u in units),
                               buffers=sum(b.untyped_storage().nbytes() for b in big.buffers()))
    with GatheredParameters(big.parameters()):  # "same initial values": bit for bit the normal build's
        out["same_init"] = zs.max_diff(big.state_dict(), normal.state_dict())

    # Trains like the normally built model: Init's partitions are adopted as ZeRO-3's units (no gather).
    states = []
    for use_init in (True, False):
        if use_init:
            with Init():
                model = build_model()
        else:
            model = build_model()
        with comm.recording() as log:
            opt = ZeroStage3(model, adam=ADAM, **ALL_PARTITIONED)
        out.setdefault("adopt_bytes", log.total_bytes())
        train(rank, world, model, opt)
        states.append(opt.state_dict())
    out["init_vs_normal"] = zs.max_diff(*states)

    # state_dict: the optimizer's is full and equals the gathered parameters; the module's refuses.
    try:
        model.state_dict()
        out["module_state_dict"] = "no error"
    except RuntimeError as e:
        out["module_state_dict"] = str(e)
    full = opt.state_dict()
    with GatheredParameters(model.parameters()):
        out["state_vs_gathered"] = max((full[n] - p).abs().max().item() for n, p in model.named_parameters())
        out["shapes"] = all(full[n].shape == p.shape for n, p in model.named_parameters())
    out["empty_after"] = all(p.numel() == 0 for p in model.parameters())

    # GatheredParameters: rank 1's edit is broadcast and re-partitioned (fp32 master shard too); None discards.
    model = build_model()
    opt = ZeroStage3(model, adam=ADAM, precision="bf16", **ALL_PARTITIONED)
    with torch.no_grad():
        with GatheredParameters(model.ln_f.parameters(), modifier_rank=1):
            model.ln_f.weight.fill_(2.5 if rank == 1 else -7.0)
        with GatheredParameters(model.ln_f.parameters()):
            model.ln_f.weight.fill_(9.0)  # discarded
    unit = next(u for u in opt.units if u.unit is unit_of(model.ln_f.weight))  # the stage's record of it
    mine = [pc for pc in unit.layout.pieces(rank) if pc.index == 0]
    out["master"] = [unit.partition.master[pc.shard_start:pc.shard_start + pc.numel].tolist() for pc in mine]
    out["edited"] = opt.state_dict()["ln_f.weight"].float().tolist()

    # Mixed precision: the same values as ZeRO-2, bit for bit (16-bit compute and reduce-scatter, fp32 masters).
    for precision in ("bf16", "fp16"):
        states = []
        for stage, kw in ((ZeroStage2, {}), (ZeroStage3, ALL_PARTITIONED)):
            model = build_model()
            scaler = DynamicLossScaler(init_scale=2**12) if precision == "fp16" else None
            opt = stage(model, adam=ADAM, precision=precision, loss_scaler=scaler, **kw)
            train(rank, world, model, opt)
            states.append(opt.state_dict() if stage is ZeroStage3 else model.state_dict())
        out[precision] = zs.max_diff(*states)
    return out


@pytest.mark.slow
def test_zero_init_gathered_parameters_and_state_dict():
    for res in zero_ref.launch(run_init, 2, timeout=120):
        c = res["construction"]
        print(c)
        # Never the whole model: its shards of everything built so far + the one module being built (or
        # gathered by apply). Sometimes + one more unit: gloo's worker thread lets go of the previous
        # all-gather's output buffer a moment after the collective has completed.
        assert c["shards"] <= c["parted"] <= c["shards"] + c["replaced"] + 2 * c["largest"] + c["buffers"]
        assert 0 <= c["shards"] - c["model"] // 2 < 4 * c["units"]  # the shards are Ψ/N, padded per unit
        assert c["whole"] >= c["model"]  # a normal build holds it all
        assert res["same_init"] == 0
        assert res["adopt_bytes"] == 0 and res["init_vs_normal"] == 0
        assert "ZeroStage3.state_dict()" in res["module_state_dict"] and "GatheredParameters" in res["module_state_dict"]
        assert res["state_vs_gathered"] == 0 and res["shapes"] and res["empty_after"]
        assert res["edited"] == [2.5] * CFG.d_model and all(v == 2.5 for piece in res["master"] for v in piece)
        assert res["bf16"] == res["fp16"] == 0


def run_init_keywords(rank, world):
    """DeepSpeed's Init / GatheredParameters keywords, and a model built with per-rank seeds."""
    def gathered(model):
        with GatheredParameters(model.parameters()):
            return {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(0)
    rank0 = {k: v.clone() for k, v in GPT(CFG).state_dict().items()}
    out = {}
    with Init():
        torch.manual_seed(rank)  # seeded per rank: Init broadcasts rank 0's values before partitioning
        out["per_rank_seed"] = zs.max_diff(gathered(GPT(CFG)), rank0)
    torch.manual_seed(rank)
    built = GPT(CFG)
    Init(module=built, data_parallel_group=torch.distributed.group.WORLD)  # partition a model built already
    out["module_kw"] = (all(p.numel() == 0 for p in built.parameters()), zs.max_diff(gathered(built), rank0))
    with Init(enabled=False, config_dict_or_path={"zero_optimization": {"stage": 3}}, dtype=torch.bfloat16):
        plain = GPT(CFG)
    out["disabled"] = all(unit_of(p) is None for p in plain.parameters())
    with GatheredParameters(built.parameters(), modifier_rank=0, enabled=False):
        out["gather_disabled"] = all(p.numel() == 0 for p in built.parameters())
    errors = []
    for kw in ({"remote_device": "nvme"}, {"sequence_data_parallel_group": torch.distributed.group.WORLD},
               {"group": torch.distributed.group.WORLD, "data_parallel_group": torch.distributed.group.WORLD}):
        try:
            Init(**kw)
        except ValueError as e:
            errors.append(str(e))
    out["errors"] = errors
    return out


@pytest.mark.slow
def test_zero_init_takes_deepspeeds_keywords_and_rank0s_values():
    for res in zero_ref.launch(run_init_keywords, 2, timeout=120):
        assert res["per_rank_seed"] == 0  # rank 1 seeded 1 and still holds rank 0's model
        assert res["module_kw"] == (True, 0)
        assert res["disabled"] and res["gather_disabled"]
        assert [e.split(":")[1].strip().split(" ")[0] for e in res["errors"]] == ["remote_device='nvme'",
                                                                              "sequence_data_parallel_group",
                                                                              "give"]


# ---------------------------------------------------------------- different control flow on different ranks

def diverge(rank, world, prefetch, catch, at=1):
    model = build_model()
    opt = ZeroStage3(model, adam=ADAM, prefetch_bucket_size=prefetch, **ALL_PARTITIONED)
    for step in range(at + 1):
        if step == at and rank == 1:
            model.blocks[1].forward = lambda x: x  # rank 1 skips a block
        idx, targets = micro_batch(step, 0, rank, world, 1)
        try:
            _, loss = model(idx, targets)
            opt.backward(loss)
            opt.step()
        except RuntimeError as e:
            if not catch:
                raise
            return str(e)
    return "no error"


@pytest.mark.slow
def test_control_flow_mismatch_is_a_clear_error_on_every_rank():
    start = time.monotonic()
    # Step 1 exchanges a header before each collective; by step 3 the order repeats: one header at the end.
    for at in (1, 3):
        messages = zero_ref.launch(diverge, 2, 0, True, at, timeout=60)
        for msg in messages:  # the same diagnosis on both ranks
            assert "rank 0 gathers 'blocks.1.ln1' for forward while rank 1 gathers 'ln_f' for forward" in msg, msg
    with pytest.raises(zero_ref.RankError, match=r"rank \d .*while rank \d"):  # with prefetch: fails, never hangs
        zero_ref.launch(diverge, 2, int(5e7), False, timeout=60)
    with pytest.raises(zero_ref.RankError, match=r"rank \d .*while rank \d"):
        zero_ref.launch(diverge, 2, int(5e7), False, 3, timeout=60)
    assert time.monotonic() - start < 50


class Reader(torch.nn.Module):
    """Reads parameters other modules hold: nn.MultiheadAttention reads out_proj's weight without calling
    out_proj, and the head multiplies by the embedding's weight in this module's own forward (this
    module holds no parameter of its own)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(23, 12)
        # no biases: the key bias's true gradient is 0 (softmax ignores a shift), so Adam would move it by ±lr
        # in a direction set by rounding, which differs between two correct summation orders
        self.attn = torch.nn.MultiheadAttention(12, 3, batch_first=True, bias=False)
        self.norm = torch.nn.LayerNorm(12)

    def forward(self, idx, targets):
        x = self.emb(idx)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        logits = self.norm(x) @ self.emb.weight.t()
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def reader_batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, 23, (4, 6), generator=g), torch.randint(0, 23, (4, 6), generator=g)


def run_external(rank, world):
    import pickle

    from zero_ref.stages import zero3
    out = {}
    for name in ("found", "registered"):
        torch.manual_seed(0)
        model = Reader()
        if name == "registered":
            zero3.register_external_parameter(model, model.emb.weight)
        opt = ZeroStage3(model, adam=ADAM, **ALL_PARTITIONED)
        before_forward = [u.name for u in opt._module_units.get(model, [])]  # registered: known at build
        for step in range(STEPS):
            idx, targets = reader_batch(step)
            rows = slice(rank * 4 // world, (rank + 1) * 4 // world)
            opt.backward(model(idx[rows], targets[rows]))
            opt.step()
        external = {m: [u.name for u in us if u not in opt._own_units.get(m, ())] for m, us in opt._module_units.items()}
        readers = {type(m).__name__: names for m, names in external.items() if names}
        out[name] = dict(state=opt.state_dict(), readers=readers, before_forward=before_forward,
                         copied=type(pickle.loads(pickle.dumps(model.attn._parameters))).__name__)
    return out


@pytest.mark.slow
def test_parameters_read_by_another_module_are_gathered_for_it():
    """What DeepSpeed's ZeROOrderedDict does: a forward that reads another module's parameter gets it gathered
    (MultiheadAttention's out_proj, a head tied by hand), found on the first forward or registered up front;
    training equals one process."""
    torch.manual_seed(0)
    model = Reader()
    ref = torch.optim.AdamW(model.parameters(), lr=ADAM.lr, weight_decay=ADAM.weight_decay, eps=ADAM.eps,
                            foreach=False)
    for step in range(STEPS):
        model(*reader_batch(step)).backward()
        ref.step()
        ref.zero_grad()
    expected = {k: v.detach() for k, v in model.state_dict().items()}
    for res in zero_ref.launch(run_external, 2, timeout=120):
        for name in ("found", "registered"):
            zs.assert_close_to_reference(res[name]["state"], expected, atol=1e-5)
            assert res[name]["readers"] == {"MultiheadAttention": ["attn.out_proj"], "Reader": ["emb"]}, name
            assert res[name]["copied"] == "dict"
        assert (res["found"]["before_forward"], res["registered"]["before_forward"]) == ([], ["emb"])


def run_gather_log(rank, world):
    model = build_model()
    opt = ZeroStage3(model, adam=ADAM, **ALL_PARTITIONED)
    untouched = opt.gather_log is None
    opt.gather_log = []
    train(rank, world, model, opt)
    return dict(untouched=untouched, log=[tuple(e) for e in opt.gather_log], peak=opt.peak_live_numel,
                sizes={u.name: u.size for u in opt.units})


@pytest.mark.slow
def test_gather_log_is_the_working_set_as_a_timeline():
    """Off by default; when set, every gather, prefetch and release in order, with the live elements after it."""
    for res in zero_ref.launch(run_gather_log, 2, timeout=120):
        assert res["untouched"]
        live, gathered = 0, set()
        for kind, unit, live_numel in res["log"]:
            if kind == "release":
                gathered.remove(unit)  # only what is gathered is released
                live -= res["sizes"][unit]
            else:
                assert unit not in gathered, unit
                gathered.add(unit)
                live += res["sizes"][unit]
            assert live_numel == live
        assert {kind for kind, _, _ in res["log"]} == {"gather", "prefetch", "release"}
        assert max(n for _, _, n in res["log"]) == res["peak"]


def run_reuse(rank, world, distance):
    """The last step's gather log with prefetch off, so every use that finds its unit released gathers it."""
    model = build_model()
    opt = ZeroStage3(model, adam=ADAM, prefetch_bucket_size=0, max_reuse_distance=distance, **ALL_PARTITIONED)
    for step in range(3):
        opt.gather_log = [] if step == 2 else None
        idx, targets = micro_batch(step, 0, rank, world, 1)
        opt.backward(model(idx, targets)[1])
        opt.step()
    return dict(log=[(kind, unit) for kind, unit, _ in opt.gather_log], sizes={u.name: u.size for u in opt.units})


@pytest.mark.slow
def test_max_reuse_distance_keeps_a_unit_used_again_within_it():
    """DeepSpeed's rule (partitioned_param_coordinator.py, ``__params_to_release``): after a use, a unit stays
    gathered if the recorded order uses it again before ``max_reuse_distance`` elements of other uses. The uses
    and the distances are read off a run with the knob off, where every use gathers."""
    off = zero_ref.launch(run_reuse, 2, 0, timeout=120)[0]
    uses = [unit for kind, unit in off["log"] if kind == "gather"]
    sizes = off["sizes"]
    distance = {}  # use index -> elements used between it and the unit's next use
    for i, unit in enumerate(uses):
        nxt = next((j for j in range(i + 1, len(uses)) if uses[j] == unit), None)
        if nxt is not None:
            distance[i] = sum(sizes[u] for u in uses[i + 1:nxt])
    assert len(distance) >= 5 and len(set(distance.values())) >= 3  # forward, then backward, uses
    limit = sorted(distance.values())[len(distance) // 2]  # keeps some units, not all
    kept = {i for i, d in distance.items() if d < limit}
    expected, last = [], {}  # a use gathers unless the unit's previous use kept it
    for i, unit in enumerate(uses):
        if last.get(unit) not in kept:
            expected.append(unit)
        last[unit] = i
    for res in zero_ref.launch(run_reuse, 2, limit, timeout=120):
        assert [unit for kind, unit in res["log"] if kind == "gather"] == expected
        assert 0 < len(expected) < len(uses)


class Attention(torch.nn.Module):
    """A DeepSpeed script's model around ``nn.MultiheadAttention``, either layout: ``batch_first`` with
    query, key and value one tensor (the fused in_proj_weight; at eval, torch's fast path), or sequence-first
    with keys and values of another width (q_proj_weight, k_proj_weight, v_proj_weight apart) and the
    averaged attention weights returned, as by default."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.emb = torch.nn.Embedding(23, 12)
        self.kv = torch.nn.Linear(12, 12 if batch_first else 8)
        self.attn = torch.nn.MultiheadAttention(12, 3, batch_first=batch_first, kdim=self.kv.out_features,
                                                vdim=self.kv.out_features)
        self.head = torch.nn.Linear(12, 23)

    def forward(self, idx, targets):
        x = self.emb(idx)  # (batch, seq, 12)
        if self.batch_first:
            x = self.kv(x)
            y = self.attn(x, x, x, need_weights=False)[0]
        else:
            q = x.transpose(0, 1)
            kv = self.kv(q)
            y, weights = self.attn(q, kv, kv)
            y = (y + weights.mean()).transpose(0, 1)  # the weights join the graph
        return torch.nn.functional.cross_entropy(self.head(x + y).flatten(0, 1), targets.flatten())


def attention_config() -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": ADAM.lr, "weight_decay": ADAM.weight_decay,
                                                       "eps": ADAM.eps}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}  # every unit partitioned


def run_attention(rank, world, batch_first):
    torch.manual_seed(0)
    model = Attention(batch_first)
    engine, *_ = zero_ref.initialize(model=model, model_parameters=model.parameters(), config=attention_config())
    losses = []
    for step in range(STEPS):
        idx, targets = reader_batch(step)
        rows = slice(rank * 2, rank * 2 + 2)
        loss = engine(idx[rows], targets[rows])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.eval()
    with torch.no_grad():
        evaluated = engine(*reader_batch(STEPS)).item()
    with zero_ref.ds.zero.GatheredParameters(list(model.parameters())):
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return dict(losses=losses, evaluated=evaluated, weights=weights)


@pytest.mark.slow
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_trains_as_one_process_through_initialize(batch_first):
    """``nn.MultiheadAttention`` reads ``out_proj.weight`` without calling out_proj (and, at eval with
    batch_first, passes every weight to one fused kernel): ZeRO-3 through ``zero_ref.initialize`` on two
    ranks trains it as single-process torch AdamW on the whole batch. Tolerance: 1e-6 relative for the
    losses, |Δw| ≤ 1e-6 for weights of scale ~0.1-1 (the two ranks' halves are added in another order),
    except the key bias (the middle third of in_proj_bias): its true gradient is 0 (softmax ignores a
    shift), so Adam moves it by rounding noise over (noise + eps), up to 5e-5 here: held to 1e-4."""
    torch.manual_seed(0)
    model = Attention(batch_first)
    ref = torch.optim.AdamW(model.parameters(), lr=ADAM.lr, weight_decay=ADAM.weight_decay, eps=ADAM.eps,
                            foreach=False)
    halves = []
    for step in range(STEPS):
        idx, targets = reader_batch(step)
        halves.append([model(idx[rows], targets[rows]).item() for rows in (slice(0, 2), slice(2, 4))])
        model(idx, targets).backward()  # the mean over both halves (equal sizes)
        ref.step()
        ref.zero_grad()
    model.eval()
    with torch.no_grad():
        evaluated = model(*reader_batch(STEPS)).item()
    for rank, res in enumerate(zero_ref.launch(run_attention, 2, batch_first, timeout=120)):
        assert res["losses"] == pytest.approx([h[rank] for h in halves], rel=1e-6)
        assert res["evaluated"] == pytest.approx(evaluated, rel=1e-6)
        expected = {n: p.detach() for n, p in model.named_parameters()}
        key_bias = slice(12, 24)
        assert (res["weights"]["attn.in_proj_bias"][key_bias] - expected["attn.in_proj_bias"][key_bias]).abs().max() < 1e-4
        for weights in (res["weights"], expected):
            weights["attn.in_proj_bias"] = torch.cat([weights["attn.in_proj_bias"][:12], weights["attn.in_proj_bias"][24:]])
        zs.assert_close_to_reference(res["weights"], expected, atol=1e-6)
