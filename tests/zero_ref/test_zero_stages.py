"""ZeRO stages 0–2 on real gloo ranks equal single-process AdamW; memory and bytes match theory."""
import pytest
import torch

import zero_ref
from zero_ref import comm
from zero_ref.stages import STAGES
from tests.zero_ref.cases import ADAM, build_model, max_diff, micro_batch, reference_params

STEPS = 5


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def train(rank, world, stage, gas, precision, clip, bucket, device="cpu"):
    from zero_ref.precision import DynamicLossScaler
    model = build_model().to(device)
    scaler = DynamicLossScaler(init_scale=2**12) if precision == "fp16" else None
    opt = STAGES[stage](model, adam=ADAM, precision=precision, gradient_accumulation_steps=gas,
                        gradient_clipping=clip, reduce_bucket_size=bucket, loss_scaler=scaler)
    with comm.recording() as log:
        for step in range(STEPS):
            for micro in range(gas):
                idx, targets = micro_batch(step, micro, rank, world, gas)
                _, loss = model(idx.to(device), targets.to(device))
                opt.backward(loss)
                applied = opt.step()
                assert applied == (micro == gas - 1)
    state = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
    return state, log.by_op()



def assert_close_to_reference(state, ref, atol):
    """|Δ| ≤ atol for every parameter (see ADAM's eps in tests/zero_ref/cases.py for why that is tight)."""
    for k in ref:
        diff = (state[k].float() - ref[k].float()).abs().max()
        assert diff <= atol, f"{k}: max |Δ| = {diff:.3g} > {atol}"


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_fp32_equals_single_process_adamw(stage, world):
    ref = reference_params(STEPS, world, gas=1)
    results = zero_ref.launch(train, world, stage, 1, "fp32", 0.0, 300, timeout=120)
    for state, _ in results:
        if world == 1:
            assert max_diff(state, ref) == 0  # same arithmetic, same order: bit for bit
        else:
            # The ranks' gradient sum adds in another order than the single-process batch mean.
            assert_close_to_reference(state, ref, atol=1e-5)
    # all ranks end bit-identical to each other
    assert all(max_diff(results[0][0], s) == 0 for s, _ in results[1:])


# ------------------------------------------------------------------ memory and communication

def measure(rank, world, stage, precision):
    from zero_ref.measure import unique_storage_bytes
    model = build_model()
    opt = STAGES[stage](model, adam=ADAM, precision=precision, reduce_bucket_size=400)
    with comm.recording() as log:
        idx, targets = micro_batch(0, 0, rank, world, 1)
        _, loss = model(idx, targets)
        opt.backward(loss)
        opt.step()
    held = {k: unique_storage_bytes(v) for k, v in opt.state_tensors().items()}
    layout = [(b.layout.numel, b.layout.padded_numel) for b in opt.buckets]
    return held, layout, [(r.op, r.numel, r.bytes) for r in log.records]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_memory_and_bytes_equal_the_theory(precision):
    from zero_ref.memory import model_state_bytes, recipe
    world = 2
    psi = sum(p.numel() for p in build_model().parameters() if p.requires_grad)
    r = recipe(precision)
    bp, bg = r.bytes_per_param("params"), r.bytes_per_param("grads")
    for stage in (0, 1, 2):
        held, layout, records = zero_ref.launch(measure, world, stage, precision, timeout=120)[0]
        real, padded = sum(n for n, _ in layout), sum(p for _, p in layout)
        assert real == psi and padded - psi < world * len(layout)  # < N−1 padding per bucket
        formula = model_state_bytes(psi, zero_stage=stage, dp=world, precision=precision)
        # Exactly the formula, with Ψ replaced by the padded element count.
        expected = model_state_bytes(padded, zero_stage=stage, dp=world, precision=precision)
        assert held == {"params": expected.params, "grads": expected.grads, "optimizer": expected.optimizer}
        assert abs(sum(held.values()) - formula.total) <= (padded - psi) * r.bytes_per_param()
        # Communication per step: stage 0 all-reduces every gradient; stages 1–2 reduce-scatter
        # them and all-gather the parameters: Ψ + Ψ, the same bytes as one all-reduce (2Ψ wire).
        ops = {op for op, _, _ in records}
        if stage == 0:
            assert ops == {"all_reduce"} and sum(b for _, _, b in records) == padded * bg
        else:
            assert sum(b for op, _, b in records if op == "reduce_scatter") == padded * bg
            assert sum(b for op, _, b in records if op == "all_gather") == padded * bp
            # ... plus one 2-element fp64 all-reduce: the global gradient norm and the overflow flag.
            assert [(op, b) for op, _, b in records if op == "all_reduce"] == [("all_reduce", 16)]
            assert ops == {"reduce_scatter", "all_gather", "all_reduce"}


# ------------------------------------------------------------------ precision, accumulation, clipping

@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_accumulation_and_clipping_equal_one_big_batch(stage):
    # GAS = 2 micro-batches per rank equals one step on the whole (2 × world × micro) batch, and
    # clipping by the global norm (across shards) equals torch.nn.utils.clip_grad_norm_.
    world, gas, clip = 2, 2, 0.5
    ref = reference_params(STEPS, world, gas, clip=clip)
    for state, _ in zero_ref.launch(train, world, stage, gas, "fp32", clip, 300, timeout=120):
        assert_close_to_reference(state, ref, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("precision,mean_share", [("bf16", 0.12), ("fp16", 0.02)])
def test_half_precision_close_to_fp32(precision, mean_share):
    # 16-bit compute with fp32 master weights, against the fp32 single-process run. An Adam update
    # moves each weight by at most ~lr per step, whatever the gradient's precision, so the hard
    # bound is 2·lr·steps; on average the 16-bit rounding (bf16 keeps 8 mantissa bits, fp16 11)
    # costs a small share of the distance the weights travelled (measured on this model after 5
    # steps: 7.7% in bf16, 0.8% in fp16; the bounds leave ~1.5–2.5× margin).
    world = 2
    ref = reference_params(STEPS, world, gas=1)
    init = {k: v.float() for k, v in build_model().state_dict().items()}
    travelled = torch.cat([(ref[k] - init[k]).abs().flatten() for k in ref]).mean()
    runs = [zero_ref.launch(train, world, stage, 1, precision, 0.0, 300, timeout=120, echo=False)[0][0]
            for stage in (0, 1, 2)]
    diff = torch.cat([(runs[0][k] - ref[k]).abs().flatten() for k in ref])
    assert diff.max() <= 2 * ADAM.lr * STEPS
    assert diff.mean() <= mean_share * travelled, (diff.mean(), travelled)
    # Sharding changes where the arithmetic happens, not what it is: the stages agree bit for bit.
    assert max_diff(runs[0], runs[1]) == 0 and max_diff(runs[0], runs[2]) == 0


def overflow_run(rank, world, stage):
    from zero_ref.precision import DynamicLossScaler
    model = build_model()
    scaler = DynamicLossScaler(init_scale=2**12, scale_window=1000, delayed_shift=1)
    opt = STAGES[stage](model, adam=ADAM, precision="fp16", loss_scaler=scaler, reduce_bucket_size=300)
    trace = []
    for step in range(3):
        idx, targets = micro_batch(step, 0, rank, world, 1)
        _, loss = model(idx, targets)
        if step == 1 and rank == 1:
            loss = loss * float("inf")  # one rank overflows
        before = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        opt.backward(loss)
        applied = opt.step()
        after = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        trace.append((applied, bool(torch.equal(before, after)), scaler.cur_scale, opt.adam_steps))
    return trace


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_an_overflow_on_one_rank_skips_the_step_on_all(stage):
    traces = zero_ref.launch(overflow_run, 2, stage, timeout=120)
    expected = [(True, False, 2.0**12, 1), (False, True, 2.0**11, 1), (True, False, 2.0**11, 2)]
    assert traces == [expected, expected]


def knobs_run(rank, world, overlap, bucket):
    model = build_model()
    opt = STAGES[2](model, adam=ADAM, overlap_comm=overlap, reduce_bucket_size=bucket, gradient_accumulation_steps=2)
    for step in range(2):
        for micro in range(2):
            _, loss = model(*micro_batch(step, micro, rank, world, 2))
            opt.backward(loss)
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, len(opt.buckets)


@pytest.mark.slow
def test_overlap_and_bucket_size_do_not_change_the_result():
    runs = [zero_ref.launch(knobs_run, 2, overlap, bucket, timeout=120, echo=False)[0]
            for overlap, bucket in ((True, 10**9), (False, 10**9), (True, 200))]
    assert runs[0][1] == runs[1][1] == 1 and runs[2][1] > 10  # one bucket, or many small ones
    assert max_diff(runs[0][0], runs[1][0]) == 0 and max_diff(runs[0][0], runs[2][0]) == 0


def kernel_run(rank, world, stage, kernel):
    torch.set_num_threads(1)
    model = build_model()
    opt = STAGES[stage](model, adam=ADAM, adam_kernel=kernel)
    for step in range(STEPS):
        _, loss = model(*micro_batch(step, 0, rank, world, 1))
        opt.backward(loss)
        opt.step()
    state = opt.state_dict() if stage == 3 else model.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}, torch.get_num_threads()


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_fused_adam_kernel_steps_every_stage(stage):
    """adam_kernel="numba" (one fused pass, as DeepSpeed's FusedAdam) trains as torch's arithmetic does, to the
    kernel's rounding (its sqrt is IEEE, torch's vectorized one is not: tests/zero_ref/test_kernels.py); the rank's one
    intra-op thread is left as it was."""
    ref = reference_params(STEPS, 2, gas=1)
    for state, threads in zero_ref.launch(kernel_run, 2, stage, "numba", timeout=120, echo=False):
        assert threads == 1
        assert_close_to_reference(state, ref, atol=1e-5)
        assert 0 < max_diff(state, zero_ref.launch(kernel_run, 2, stage, "torch", timeout=120, echo=False)[0][0]) \
            <= 1e-6  # not the torch path (it would be 0), and as close as the kernels are to it
        break
    with pytest.raises(ValueError, match="adam_kernel must be one of torch, numba, cuda, got 'fused'"):
        STAGES[stage](build_model(), adam=ADAM, adam_kernel="fused")


# ------------------------------------------------------------------ GPU (run on a lent device machine)

def cuda_run(rank, world, stage):
    import gc

    from zero_ref.measure import cuda_requested_bytes, unique_storage_bytes
    state, _ = train(rank, world, stage, 1, "fp32", 0.0, 300, device="cuda")
    gc.collect()
    base = cuda_requested_bytes()  # after train(): cuBLAS's workspace is already there
    model = build_model().cuda()
    opt = STAGES[stage](model, adam=ADAM)
    loss = model(*(t.cuda() for t in micro_batch(0, 0, rank, world, 1)))[1]  # the logits freed at once
    opt.backward(loss)
    opt.step()
    del loss
    held = sum(unique_storage_bytes(v) for v in opt.state_tensors().values())
    others = unique_storage_bytes([model.pos_emb.weight] + list(model.buffers()))  # frozen param, masks
    return state, held, others, cuda_requested_bytes() - base


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: run on a GPU machine")
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_one_rank_nccl_on_cuda(stage):
    ref = reference_params(STEPS, 1, gas=1)
    state, held, others, allocated = zero_ref.launch(cuda_run, 1, stage, backend="nccl", timeout=300)[0]
    assert_close_to_reference(state, ref, atol=1e-4)  # CUDA kernels add in another order than the CPU
    # At rest, the CUDA tensors the engine added are the model states (+ the frozen parameter and the
    # buffers), byte for byte.
    assert allocated - held - others == 0, (allocated, held, others)
