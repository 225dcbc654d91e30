"""ZeRO++ on ZeRO-3 (qwZ, hpZ, qgZ): the block quantizer exactly, then real gloo ranks.

Bytes: every collective of a step is predicted from plain ZeRO-3's collectives of the same step (same units,
same order) by the paper's formulas, scales and padding included. Values: hpZ is bit for bit plain ZeRO-3
(and so single-process AdamW); qwZ's forward reads exactly the dequantized weights, each within half a block
scale of the true one; qgZ's reduced gradient is within the summed half-scales of the exact sum. A broken
quantizer fails these checks.
"""
import pytest
import torch

import zero_ref
from zero_ref import comm
from zero_ref.stages import ZeroStage3
from zero_ref.stages.zero3 import block_quant
from zero_ref.stages.zero3.block_quant import block_count, dequantize, padded, quantize
from zero_ref.stages.zero3.quantized_gather import quantized_all_gather
from zero_ref.stages.zero3.quantized_reduce import QuantizedReduce, node_groups
from zero_ref.stages.zero3.secondary_partition import subgroups
from zero_ref.stages.zero3.zeropp import ZeroPP
from tests.zero_ref import test_zero_stages as zs
from tests.zero_ref.cases import ADAM, build_model, micro_batch, reference_params

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 3
KW = dict(param_persistence_threshold=0)  # every toy unit partitioned (the default keeps them whole)


def truncating(x, bits=8, rows=1):
    """A broken quantizer: rounds toward zero, so an element can be off by a whole step."""
    qm = block_quant.q_max(bits)
    x = x.detach().reshape(rows, -1).float()
    n = padded(x.shape[1])
    x = torch.nn.functional.pad(x, (0, n - x.shape[1])).reshape(rows * block_count(n), -1)
    scales = x.abs().amax(dim=1).clamp_min(1e-30) / qm
    q = torch.trunc(x / scales[:, None]).to(torch.int8).reshape(-1)
    if bits == 4:
        q = q.reshape(-1, 2)
        q = ((q[:, 0] & 0xF) | (q[:, 1] << 4)).to(torch.uint8)
    return q, scales


def unsigned_nibbles(q, scales, numel, bits=4, rows=1, dtype=torch.float32):
    """A broken int4 dequantizer: it forgets to sign-extend, so −1 comes back as 15."""
    b = q.view(torch.uint8).to(torch.int16)
    values = torch.stack((b & 0xF, b >> 4), dim=1).reshape(scales.numel(), -1).float() * scales[:, None]
    return values.reshape(rows, -1)[:, :numel].to(dtype).reshape(-1)


# ---------------------------------------------------------------- the quantizer alone

def block_error(x, bits, quantizer=quantize):
    """(max over elements of |x − deq(q(x))| − scale/2 of its block, bytes sent)."""
    q, s = quantizer(x, bits)
    back = dequantize(q, s, x.numel(), bits)
    per_elem_scale = s.repeat_interleave(padded(x.numel()) // s.numel())[:x.numel()]
    return ((x - back).abs() - per_elem_scale / 2).max().item(), q.numel() * q.element_size() + 4 * s.numel()


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("numel", [1, 7, 8, 510, 8000, 8008, 40000, 123457])
def test_every_element_within_half_a_block_scale_and_bytes_exact(numel, bits):
    torch.manual_seed(numel)
    x = torch.randn(numel) * torch.logspace(-3, 1, numel)  # blocks of very different magnitudes
    excess, nbytes = block_error(x, bits)
    assert excess <= 1e-7 * x.abs().max().item()  # |x − deq(q(x))| ≤ s/2 (fp32 rounding aside)
    n = padded(numel)
    assert nbytes == n * bits // 8 + 4 * block_count(n) == block_quant.quantized_bytes(numel, bits)


def test_block_count_is_deepspeeds_loop_at_any_size():
    """block_count finds DeepSpeed's count (CUDAQuantizer.quantize's ``groups += 1`` loop, then its doubling)
    through divisors, so the planner can count the blocks of whole layers."""
    import math
    import random

    def loop(numel):
        groups = math.ceil(numel / 8000)
        while groups < numel and numel % (8 * groups):
            groups += 1
        while numel % (16 * groups) == 0 and numel / groups > 8000:
            groups *= 2
        return groups

    rng = random.Random(0)
    sizes = [8, 16, 512, 8000, 8008, 16000, 96008, 8 * 1_000_003] + [8 * rng.randint(1, 2_000_000) for _ in range(500)]
    assert [block_count(n) for n in sizes] == [loop(n) for n in sizes]


def test_a_truncating_quantizer_breaks_the_bound():
    x = torch.randn(4096)
    assert block_error(x, 8, truncating)[0] > 0.1 * x.abs().max().item() / 127


def test_rows_quantize_apart_and_zeros_and_int4_signs_come_back_exactly():
    x = torch.tensor([[-7., -1, 0, 1, 2, 3, 7, 5], [0., 0, 0, 0, 0, 0, 0, 0]])
    q, s = quantize(x, bits=4, rows=2)
    assert q.dtype == torch.uint8 and q.numel() == 8 and s.tolist() == [1.0, 1.0]
    assert dequantize(q, s, 8, bits=4, rows=2).tolist() == x.reshape(-1).tolist()
    q, s = quantize(torch.tensor([1., -2, 3]), bits=8)  # padded to 8, one block
    assert q.numel() == 8 and s.numel() == 1 and dequantize(q, s, 3).shape == (3,)


@pytest.mark.peers
@pytest.mark.parametrize("numel", [8, 512, 8000, 8008, 16000, 64000, 96008, 1_000_000])
def test_block_count_is_deepspeeds(numel, monkeypatch):
    """DeepSpeed's CUDAQuantizer.quantize chooses the group count, then calls its CUDA op: catch the count."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    seen = []

    class Op:
        Symmetric = "sym"

        def quantize(self, param, groups, bits, kind):
            seen.append((groups, bits, kind))

    q = object.__new__(CUDAQuantizer)
    q.quantizer_cuda_module, q.group_size_cache = Op(), {}
    q.quantize(torch.zeros(numel))
    assert seen == [(block_count(numel), 8, "sym")]


def test_groups_are_consecutive_ranks_and_columns():
    assert subgroups([0, 1, 2, 3, 4, 5], 3) == [[0, 1, 2], [3, 4, 5]]
    assert node_groups(list(range(8)), 4) == ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]])
    with pytest.raises(ValueError, match="zero_hpz_partition_size 3 must divide the 4"):
        subgroups([0, 1, 2, 3], 3)


# ---------------------------------------------------------------- on ranks

# qgZ's blocks: DeepSpeed's are about one row of each gradient (max(rows, cols, world) groups per tensor);
# the toy's rows are 21 wide, so 64 here (the default 512 suits rows of thousands).
GRAD_BLOCK = 64


def configs(world):
    g = 2 if world == 4 else 1
    qgz = dict(quantized_gradients=True, hpz_partition_size=g, gradient_block=GRAD_BLOCK)
    return {"plain": ZeroPP(), "qwz": ZeroPP(quantized_weights=True), "hpz": ZeroPP(hpz_partition_size=g),
            "qgz": ZeroPP(**qgz), "all": ZeroPP(quantized_weights=True, **qgz),
            "qgz_broken": ZeroPP(**qgz)}  # with unsigned_nibbles


def records(log):
    """(op, dtype, bytes, group size) of the step's collectives; the path check's int64 headers left out."""
    return [(r.op, r.dtype, r.bytes, r.group_size) for r in log.records if r.dtype != "int64"]


def gathered_within_half_scale(opt, model, truth):
    """max over units and elements of |w_gathered − w| − max|w_unit|/254 (≤ 0: within half a scale of the
    unit's largest block), gathering every unit as the stage does."""
    worst = -1.0
    got = opt.state_dict()
    for u in opt.units:
        names = [n for n, p in model.named_parameters() if any(p is q for q in u.params)]
        bound = max(truth[n].abs().max().item() for n in names) / 254
        worst = max(worst, max((got[n] - truth[n]).abs().max().item() - bound for n in names))
    return worst


def run(rank, world):
    out = {}
    for name, zp in configs(world).items():
        model = build_model()
        opt = ZeroStage3(model, adam=ADAM, zeropp=zp, **KW)
        if name.endswith("broken"):
            opt.quantized_reduce.dequantize = unsigned_nibbles
        truth = build_model().state_dict()
        first = opt.state_dict()  # every unit through the stage's gather (qwZ: dequantized int8)
        out[f"{name}_within"] = gathered_within_half_scale(opt, model, truth)
        losses = []
        for step in range(STEPS):
            with comm.recording() as log:
                idx, targets = micro_batch(step, 0, rank, world, 1)
                _, loss = model(idx, targets)
                opt.backward(loss)
                opt.step()
            losses.append(loss.item())
            if step == 0:  # this rank's fp32 master shards after one step
                shard1 = torch.cat([u.unit.part.clone() for u in opt.units if u.params[0].requires_grad])
        ref = build_model()  # the first step's loss from the weights the ranks gathered, in one process
        ref.load_state_dict(first)
        out[name] = dict(losses=losses, first_ref=ref(*micro_batch(0, 0, rank, world, 1))[1].item(),
                         state=opt.state_dict(), records=records(log),
                         units=[(u.size, u.persistent, u.params[0].requires_grad) for u in opt.units], shard1=shard1)
        _, loss = model(*micro_batch(0, 0, rank, world, 1))  # a backward without a step: hpZ's copies stay
        opt.backward(loss)
        out[name]["secondary"] = sum(u.unit.zeropp.secondary.numel() for u in opt.units
                                     if u.unit.zeropp is not None and u.unit.zeropp.secondary is not None)
        out[name]["param_bytes"] = sum(t.numel() * t.element_size() for t in opt.state_tensors()["params"])

    # a broken quantizer behind qwZ: the gathered weights leave the half-scale bound
    real, block_quant.quantize = block_quant.quantize, truncating
    try:
        model = build_model()
        out["broken_within"] = gathered_within_half_scale(ZeroStage3(model, adam=ADAM, zeropp=ZeroPP(True), **KW),
                                                          model, build_model().state_dict())
    finally:
        block_quant.quantize = real

    # the collectives alone, on data every rank can rebuild
    shards = [torch.randn(1003, generator=torch.Generator().manual_seed(r)) * (r + 1) for r in range(world)]
    full = torch.empty(1003 * world)
    quantized_all_gather(full, shards[rank])
    out["gather"] = (full - torch.cat([dequantize(*quantize(s), 1003) for s in shards])).abs().max().item()
    out["reduce"] = {}
    for name, dequantizer in (("correct", dequantize), ("broken", unsigned_nibbles)):
        qr = QuantizedReduce(None, 2 if world == 4 else world, GRAD_BLOCK)
        qr.dequantize = dequantizer
        data = [torch.randn(world * 257, generator=torch.Generator().manual_seed(10 + r)) for r in range(world)]
        mine = torch.empty(257)
        qr(mine, data[rank].clone())
        exact = torch.stack(data).sum(0).reshape(world, 257)[rank]
        L = qr.node_size
        nodes = [torch.stack(data[m * L:(m + 1) * L]) for m in range(world // L)]
        bound = sum(d.abs().max().item() / 14 for d in data)  # step 1: each source within s/2, s = max/7
        bound += sum((n.sum(0).abs().max().item() + sum(d.abs().max().item() / 14 for d in n)) / 14 for n in nodes) \
            if len(nodes) > 1 else 0.0  # step 2: each node's requantized partial sum within its s/2
        out["reduce"][name] = ((mine - exact).abs().max().item(), bound)
    return out


@pytest.fixture(scope="module", params=[2, 4])
def runs(request):
    return request.param, zero_ref.launch(run, request.param, timeout=300)


def qwz_pair(nbytes, world):
    """An fp32 all-gather of ``nbytes`` (the full buffer) as qwZ sends it: int8 blocks, then fp32 scales."""
    s = padded(nbytes // 4 // world)
    return [("all_gather", "int8", world * s), ("all_gather", "float32", 4 * world * block_count(s))]


def qgz_steps(nbytes, world, node, b=GRAD_BLOCK):
    """An fp32 reduce-scatter of ``nbytes`` as qgZ sends it: (op, dtype, bytes, group size) of each all-to-all:
    int4 (half a byte) per element of rows padded to the block, one fp32 scale per block."""
    s, M = nbytes // 4 // world, world // node
    row1, row2 = -(-M * s // b) * b, -(-s // b) * b
    out = [("all_to_all", "uint8", node * row1 // 2, node), ("all_to_all", "float32", 4 * node * row1 // b, node)]
    if M > 1:
        out += [("all_to_all", "uint8", M * row2 // 2, M), ("all_to_all", "float32", 4 * M * row2 // b, M)]
    return out


def gather_groups(got, qwz):
    """The group size of each gather in ``got``, in order (qwZ: two records a gather; the int8 one counts)."""
    return [n for o, d, _, n in got if o == "all_gather" and (d == "int8" or not qwz)]


def expected(plain, world, qwz=False, g=1, qgz=False, groups=None, block=GRAD_BLOCK):
    """The step's collectives under ZeRO++, from plain ZeRO-3's: each gather quantized (over its group:
    ``groups[i]`` ranks, each quantizing its 1/groups[i] of the unit) and/or each reduce-scatter as qgZ's
    all-to-alls."""
    out, node, i = [], g if g > 1 else world, 0
    for op, dtype, nbytes, n in plain:
        if op == "all_gather":
            n = groups[i] if groups else n
            i += 1
            out += [(o, d, b, n) for o, d, b in (qwz_pair(nbytes, n) if qwz else [(op, dtype, nbytes)])]
        elif op == "reduce_scatter" and qgz:
            out += qgz_steps(nbytes, world, node, block)
        else:
            out.append((op, dtype, nbytes, n))
    return out


@pytest.mark.slow
def test_bytes_are_the_papers(runs):
    world, results = runs
    g = 2 if world == 4 else 1
    for res in results:
        plain = res["plain"]["records"]
        units = res["plain"]["units"]
        assert all(not persistent for _, persistent, _ in units)
        trainable = sum(1 for *_, t in units if t)
        assert res["qwz"]["records"] == expected(plain, world, qwz=True)
        got = res["qgz"]["records"]  # (with hpZ)
        assert got == expected(plain, world, g=g, qgz=True, groups=gather_groups(got, False))
        # hpZ: the same gathers, byte for byte; each unit's first one of the step over all ranks, the rest
        # (backward's, and a tied weight's second forward use) inside the sub-group
        for name, qwz, qgz in (("hpz", False, False), ("all", True, True)):
            got = res[name]["records"]
            groups = gather_groups(got, qwz)
            assert got == expected(plain, world, qwz=qwz, g=g, qgz=qgz, groups=groups)
            if g == 1:  # hpZ off
                assert set(groups) == {world}
                continue
            # one per trainable unit: the step's first gather (forward); a frozen unit's secondary copy never
            # goes stale (DeepSpeed keeps it too: partitioned_param_coordinator.py, __all_gather_params_)
            assert groups.count(world) == trainable
            plain_gathers = sum(1 for r in plain if r[0] == "all_gather")
            assert groups.count(g) == len(groups) - trainable == plain_gathers - trainable
        # the paper's factors: int8 is half of fp16's 2Ψ (+ padding), int4 across nodes a quarter of fp16's
        fp32_gathers = sum(b for o, _, b, _ in plain if o == "all_gather")
        int8 = sum(b for o, d, b, _ in res["qwz"]["records"] if d == "int8")
        pad = sum(world * padded(b // 4 // world) - b // 4 for o, _, b, _ in plain if o == "all_gather")
        assert int8 == fp32_gathers // 4 + pad == (2 * fp32_gathers // 4) // 2 + pad
        if g > 1:
            M = world // g
            a2a = [r for r in res["qgz"]["records"] if r[0] == "all_to_all"]  # per reduce: 2 inside, 2 across nodes
            cross = sum(b * (M - 1) / M for i, (_, _, b, _) in enumerate(a2a) if i % 4 >= 2)
            shards = [b // 4 // world for o, _, b, _ in plain if o == "reduce_scatter"]
            row = [-(-s // GRAD_BLOCK) * GRAD_BLOCK for s in shards]
            assert cross == sum((M - 1) * (r // 2 + 4 * r // GRAD_BLOCK) for r in row)
            # hpZ's backward gathers cross no node: only the primary (forward) gathers span all ranks
            assert sum(b for o, _, b, n in res["hpz"]["records"] if o == "all_gather" and n == world) == \
                sum(4 * size for size, _, t in units if t)


@pytest.mark.slow
def test_hpz_memory_is_the_extra_secondary_shard(runs):
    world, results = runs
    g = 2 if world == 4 else 1
    for res in results:
        units = res["plain"]["units"]
        if g > 1:
            assert res["hpz"]["secondary"] == sum(size // g for size, *_ in units)
        assert res["hpz"]["param_bytes"] - res["plain"]["param_bytes"] == 4 * res["hpz"]["secondary"]


@pytest.mark.slow
def test_hpz_trains_exactly_as_zero3_and_one_process(runs):
    world, results = runs
    ref = reference_params(STEPS, world, gas=1)
    for res in results:  # the same values as ZeRO-3 bit for bit; ZeRO-3 sums over ranks in another order than
        assert res["hpz"]["losses"] == res["plain"]["losses"]  # one process: test_zero3's 1e-5 (cases.py's eps)
        for k in ref:
            assert torch.equal(res["hpz"]["state"][k], res["plain"]["state"][k])
        zs.assert_close_to_reference(res["hpz"]["state"], ref, atol=1e-5)


@pytest.mark.slow
def test_qwz_forward_reads_the_dequantized_weights(runs):
    world, results = runs
    for res in results:
        assert res["plain_within"] <= 0  # full precision: exact
        assert res["qwz_within"] <= 1e-7  # every gathered weight within half its block's scale
        assert res["broken_within"] > 1e-6  # a truncating quantizer leaves that bound
        first, ref = res["qwz"]["losses"][0], res["qwz"]["first_ref"]
        assert abs(first - ref) <= 1e-6 * abs(ref)  # the loss of exactly those weights
        assert res["gather"] == 0.0  # the gather is each rank's own quantization, dequantized


@pytest.mark.slow
def test_qgz_sum_within_the_quantization_bound(runs):
    world, results = runs
    for res in results:
        err, bound = res["reduce"]["correct"]
        assert err <= bound and err > 0
        err, bound = res["reduce"]["broken"]
        assert err > bound


@pytest.mark.slow
def test_quantized_training_stays_near_full_precision(runs):
    """Adam's first step moves each weight by −lr·g/(|g| + eps): about −lr·sign(g), whatever |g|. So a weight
    moves as in full precision (within lr/10) where the quantization error leaves its gradient's sign (and
    its being above eps): qwZ's weights are within 1/254 of their block's largest, so nearly all do (≥ 95%);
    qgZ's int4 gradient is within 1/14 of its block's largest per source, which zeroes or flips the smallest
    gradients of a block (≥ 75% here; a dequantizer that forgets the int4 sign: under 60%). Losses over
    STEPS steps stay within 1% of ZeRO-3's."""
    world, results = runs
    for res in results:
        plain = res["plain"]["losses"]
        for name in ("qwz", "qgz", "all"):
            assert max(abs(a - b) / b for a, b in zip(res[name]["losses"], plain)) <= 1e-2, name

        def agree(name):
            return ((res[name]["shard1"] - res["plain"]["shard1"]).abs() <= ADAM.lr / 10).float().mean().item()
        assert agree("hpz") == 1.0 and agree("qwz") >= 0.95
        assert agree("qgz") >= 0.75 and agree("all") >= 0.75
        assert agree("qgz_broken") < 0.6


# ---------------------------------------------------------------- from a DeepSpeed config

def from_config(rank, world):
    model = build_model()
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
            "zero_quantized_weights": True, "zero_hpz_partition_size": 2, "zero_quantized_gradients": True,
            "zero_quantized_nontrainable_weights": True}
    engine, *_ = zero_ref.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": zero})
    with comm.recording() as log:
        _, loss = engine(*micro_batch(0, 0, rank, world, 1))
        engine.backward(loss)
        engine.step()
    zp = engine.optimizer.zeropp
    ops = {(r.op, r.dtype, r.group_size) for r in log.records if r.dtype != "int64"}
    frozen = [u.unit.zeropp.quantize for u in engine.optimizer.units if not u.params[0].requires_grad]
    return (zp.quantized_weights, zp.hpz_partition_size, zp.quantized_gradients), ops, frozen


@pytest.mark.slow
def test_a_deepspeed_config_turns_them_on():
    for keys, ops, frozen in zero_ref.launch(from_config, 4, timeout=300):
        assert keys == (True, 2, True) and frozen == [True]
        assert {("all_gather", "int8", 4), ("all_gather", "int8", 2), ("all_to_all", "uint8", 2)} <= ops
        assert not {op for op in ops if op[0] == "reduce_scatter"}


def test_an_hpz_size_that_does_not_divide_the_ranks_is_refused():
    from zero_ref.config import problems
    bad = problems({"train_batch_size": 12, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4}}, dp=6)
    assert [e.key for e in bad] == ["zero_optimization.zero_hpz_partition_size"]
    assert "does not divide the 6 data-parallel ranks" in str(bad[0])
    ok = {"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}
    assert problems(ok, dp=4) == []  # DeepSpeed: min(8, 4 ranks) = 4


# ---------------------------------------------------------------- ranks that take different paths

def diverge(rank, world, at):
    model = build_model()
    opt = ZeroStage3(model, adam=ADAM, zeropp=ZeroPP(True, 2, True), prefetch_bucket_size=0, **KW)
    for step in range(at + 1):
        if step == at and rank == 1:
            model.blocks[1].forward = lambda x: x  # rank 1 skips a block
        try:
            _, loss = model(*micro_batch(step, 0, rank, world, 1))
            opt.backward(loss)
            opt.step()
        except RuntimeError as e:
            return str(e)
    return "no error"


@pytest.mark.slow
def test_a_control_flow_mismatch_under_zeropp_is_a_clear_error():
    """The path check's stand-in collectives (a rank that left the path) are ZeRO++'s: no hang, one diagnosis."""
    for at in (1, 3):  # headers before each collective; then the recorded order, checked at the end
        for msg in zero_ref.launch(diverge, 2, at, timeout=120):
            assert "rank 0 gathers 'blocks.1.ln1' for forward while rank 1 gathers 'ln_f' for forward" in msg, msg


# ---------------------------------------------------------------- built under zero.Init (DeepSpeed's Init.__init__)

def init_config(**zero):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
                                  **zero}}


def built_run(rank, world, how):
    """Train STEPS steps under the config with qwZ and hpZ 2; the model built as ``how`` says."""
    import warnings
    from zero_ref.ds import zero as ds_zero
    from zero_ref.stages.zero3.secondary_partition import new_subgroups
    nontrainable = how.endswith("nontrainable")  # qnW instead of qwZ
    cfg = init_config(zero_quantized_weights=not nontrainable, zero_hpz_partition_size=2,
                      zero_quantized_nontrainable_weights=nontrainable)
    if how.startswith("plain"):
        model = build_model()
    elif how == "keywords":  # DeepSpeed's keywords instead of the config: the hpZ group itself, qwZ
        with ds_zero.Init(zero_param_parallel_group=new_subgroups(None, 2), zero_quantized_weights=True):
            model = build_model()
    else:  # "init", "init_nontrainable": the config; "bare": zero.Init() knows no ZeRO++
        with ds_zero.Init(config_dict_or_path=None if how == "bare" else cfg):
            model = build_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, *_ = zero_ref.initialize(model=model, config=cfg)
    losses, log_all = [], []
    for step in range(STEPS):
        with comm.recording() as log:
            _, loss = engine(*micro_batch(step, 0, rank, world, 1))
            engine.backward(loss)
            engine.step()
        losses.append(loss.item())
        log_all.append(records(log))
    units = engine.optimizer.units
    frozen = [u.unit.zeropp is not None and u.unit.zeropp.quantize for u in units if not u.params[0].requires_grad]
    secondary_groups = {None if u.unit.zeropp is None or u.unit.zeropp.subgroup is None
                        else comm.get_world_size(u.unit.zeropp.subgroup) for u in units}
    return dict(losses=losses, records=log_all, state=engine.optimizer.state_dict(), frozen=frozen,
                secondary_groups=secondary_groups,
                warnings=[str(w.message) for w in caught if "zero.Init built" in str(w.message)])


@pytest.fixture(scope="module")
def built():
    return {how: zero_ref.launch(built_run, 4, how, timeout=300)
            for how in ("plain", "init", "keywords", "bare", "plain_nontrainable", "init_nontrainable")}


@pytest.mark.slow
def test_init_reads_the_zeropp_keys_and_trains_as_without_it(built):
    """zero.Init(config_dict_or_path=cfg) then initialize(cfg): the same collectives, bytes, losses and weights,
    bit for bit, as the model built without Init (4 ranks, hpZ sub-groups of 2, qwZ); so do DeepSpeed's keywords."""
    for how in ("init", "keywords"):
        for plain, got in zip(built["plain"], built[how]):
            assert got["records"] == plain["records"] and got["losses"] == plain["losses"]
            assert all(torch.equal(got["state"][k], v) for k, v in plain["state"].items())
            assert got["secondary_groups"] == {2} and got["warnings"] == []
    ops = {(op, dtype, n) for step in built["plain"][0]["records"] for op, dtype, _, n in step}
    assert {("all_gather", "int8", 4), ("all_gather", "int8", 2)} <= ops  # qwZ over all ranks, then in the node


@pytest.mark.slow
def test_a_bare_init_keeps_hpz_off_as_deepspeed_does(built):
    """Parameters zero.Init() built without ZeRO++ keep no secondary partition under an hpZ config (DeepSpeed
    0.19.8 converts only parameters no Init partitioned): every gather spans the 4 ranks, and a warning says so."""
    for res in built["bare"]:
        assert res["secondary_groups"] == {None}
        assert {n for step in res["records"] for op, _, _, n in step if op == "all_gather"} == {4}
        assert len(res["warnings"]) == 1 and "zero_hpz_partition_size 1 (initialize's config: 2)" in res["warnings"][0]


@pytest.mark.slow
def test_nontrainable_quantization_is_decided_when_init_partitions(built):
    """zero_quantized_nontrainable_weights quantizes a weight frozen when it is partitioned: the toy's position
    embedding is frozen after construction, so under zero.Init its gathers stay full precision (DeepSpeed stores
    only weights frozen at partition time in int8), with a warning; built without Init it is frozen when
    initialize partitions it, and its gathers are quantized."""
    for init, plain in zip(built["init_nontrainable"], built["plain_nontrainable"]):
        assert plain["frozen"] == [True] and plain["warnings"] == []
        assert init["frozen"] == [False] and init["secondary_groups"] == {2}
        assert len(init["warnings"]) == 1 and "frozen weights not quantized" in init["warnings"][0]
        assert init["records"] != plain["records"]
