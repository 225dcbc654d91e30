"""The fused Adam kernels against torch.optim.AdamW / Adam: every backend, 10 steps, odd sizes.

Tolerance. ``torch`` (``zero_ref.optim.adam_step_``) is torch's arithmetic op for op: equal bit
for bit. The fused kernels update the moments with torch's operations in torch's order, with a
fused multiply-add exactly where torch's vectorized CPU kernels (AVX2, AVX-512) use one, so for AdamW
both moments equal torch's bit for bit there (on ATen's default kernels, to rounding). The parameters differ in the last bits of some elements: the
denominator is DeepSpeed's, fma(sqrt(v), 1/sqrt(bc2), eps), one division where torch has two
(see ``AdamConstants``), and torch's CPU ``sqrt`` is not correctly rounded (off by one ulp in
~16-20 % of elements, ``test_torch_cpu_sqrt_is_not_correctly_rounded``) while the kernels' IEEE
sqrt is. An ulp of the denominator becomes an ulp of the update. Hence the bound: after 10 steps,
``max|p - p_ref| <= 1e-6 * max|p_ref|`` (measured: ~6e-8), and element by element
``|p - p_ref| <= 1e-6 * |p_ref| + ATOL`` — the second term covers parameters that pass near
zero, where an ulp of the update is large relative to the parameter: an update is at most
``lr / (1 - beta1) = 10 lr`` (the first step), an ulp of it 10 lr * 2^-23, and ten steps add at
most ten of those, ATOL = 100 lr * 2^-23 ≈ 1.2e-5 lr (measured: at most 1.4e-6 lr).
"""
import math
import os
import subprocess

import numpy as np
import pytest
import torch

from zero_ref.kernels import AdamConstants, AdamTensors, adam_step, available_backends, numba_cpu, numba_cuda, roofline
from zero_ref.optim import AdamConfig

from tests.helpers import ROOT
LR, WD, STEPS = 1e-2, 0.1, 10
ATOL = STEPS * (LR / (1 - 0.9)) * 2**-23
SIZES = [1, 7, 33, 1000, numba_cpu.CHUNK + 5]  # the last one crosses a chunk boundary
# torch's vectorised CPU kernels that fuse the moments' multiply-adds where the fused kernels do (measured
# bit for bit on both); ATen's default (scalar) kernels don't.
FMA_KERNEL_SETS = {"AVX2", "AVX512"}
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")


def run_vs_torch(sizes, backend, adamw, device="cpu", single=False, seed=0):
    """10 steps of torch.optim.AdamW (adamw) / Adam with L2 against adam_step on copies."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(n, generator=gen).to(device) for n in sizes]
    ref = [p.clone().requires_grad_() for p in params]
    opt = (torch.optim.AdamW if adamw else torch.optim.Adam)(ref, lr=LR, weight_decay=WD)
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    cfg = AdamConfig(lr=LR, weight_decay=WD, adamw=adamw)
    for step in range(1, STEPS + 1):
        grads = [torch.randn(n, generator=gen).to(device) for n in sizes]
        for r, g in zip(ref, grads):
            r.grad = g.clone()
        opt.step()
        if single:
            adam_step(params[0], grads[0], ms[0], vs[0], step, cfg, backend=backend)
        else:
            adam_step(params, grads, ms, vs, step, cfg, backend=backend)
    return params, ms, vs, ref, opt


def assert_close_to_torch(params, ref):
    for p, r in zip(params, ref):
        r = r.detach()
        assert (p - r).abs().max() <= 1e-6 * r.abs().max(), (p - r).abs().max() / r.abs().max()
        assert ((p - r).abs() <= 1e-6 * r.abs() + ATOL).all(), ((p - r).abs() - 1e-6 * r.abs()).max() / LR


@pytest.mark.parametrize("adamw", [True, False], ids=["adamw", "adam_l2"])
@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_cpu_backends_match_torch_multi_tensor(backend, adamw):
    params, ms, vs, ref, opt = run_vs_torch(SIZES, backend, adamw)
    assert_close_to_torch(params, ref)
    moments_equal = all(torch.equal(m, opt.state[r]["exp_avg"]) and torch.equal(v, opt.state[r]["exp_avg_sq"])
                        for m, v, r in zip(ms, vs, ref))
    if backend == "torch":  # the reference is torch's arithmetic, op for op
        assert moments_equal and all(torch.equal(p, r.detach()) for p, r in zip(params, ref))
    elif adamw and torch.backends.cpu.get_cpu_capability() in FMA_KERNEL_SETS:
        assert moments_equal  # the moments never see the parameters in AdamW: same ops, same bits
    elif adamw:  # ATen's default kernels round each product apart: the moments agree to rounding
        for m, v, r in zip(ms, vs, ref):
            for mine, theirs in ((m, opt.state[r]["exp_avg"]), (v, opt.state[r]["exp_avg_sq"])):
                assert (mine - theirs).abs().max() <= 2**-22 * theirs.abs().max()


@pytest.mark.parametrize("n", [1, 7, numba_cpu.CHUNK + 5])
@pytest.mark.parametrize("adamw", [True, False], ids=["adamw", "adam_l2"])
def test_numba_single_flat_tensor_matches_torch(n, adamw):
    params, ms, vs, ref, opt = run_vs_torch([n], "numba", adamw, single=True, seed=n)
    assert_close_to_torch(params, ref)


def test_numba_multi_tensor_equals_flat_partition_bit_for_bit():
    """Stepping views of one flat buffer in one multi-tensor call = stepping the flat buffer."""
    gen = torch.Generator().manual_seed(1)
    flat = [torch.randn(sum(SIZES), generator=gen) for _ in range(2)] + [torch.zeros(sum(SIZES)) for _ in range(2)]
    split = [t.clone() for t in flat]
    views = [list(t.split(SIZES)) for t in split]
    cfg = AdamConfig(lr=LR, weight_decay=WD)
    for step in range(1, 4):
        adam_step(*flat, step, cfg)
        AdamTensors(*views).step(step, cfg)
    assert all(torch.equal(a, b) for a, b in zip(flat, split))


def test_torch_cpu_sqrt_is_not_correctly_rounded():
    """Why the kernels' parameters differ from torch's in the last bits (see the module doc)."""
    v = torch.rand(100_000, generator=torch.Generator().manual_seed(0))
    exact = np.sqrt(v.numpy())  # IEEE: correctly rounded, as the kernels' sqrt
    differ = (v.sqrt().numpy() != exact).mean()
    ulps = np.abs(v.sqrt().numpy().view(np.int32) - exact.view(np.int32)).max()
    assert ulps <= 1
    if differ == 0:
        pytest.skip("this torch build's CPU sqrt is correctly rounded: the kernels may match torch bit for bit")


def test_params16_copy_and_16bit_grads_on_the_torch_reference():
    gen = torch.Generator().manual_seed(2)
    p = torch.randn(37, generator=gen)
    g = torch.randn(37, generator=gen).bfloat16()
    m, v, p16 = torch.zeros(37), torch.zeros(37), torch.empty(37, dtype=torch.bfloat16)
    expect, em, ev = p.clone(), m.clone(), v.clone()
    cfg = AdamConfig(lr=LR)
    adam_step(p, g, m, v, 1, cfg, backend="torch", params16=p16)
    adam_step(expect, g.float(), em, ev, 1, cfg, backend="torch")
    assert torch.equal(p, expect) and torch.equal(p16, expect.bfloat16())


def test_numba_cuda_in_the_simulator():
    """numba.cuda's kernel under NUMBA_ENABLE_CUDASIM=1 (a subprocess), 10 steps, sizes 1, 7, 300."""
    result = numba_cuda.simulate(sizes=(1, 7, 300), steps=STEPS)
    assert result["adamw"] <= 1e-6 and result["adam_l2"] <= 1e-6, result


def test_constants_follow_the_config():
    k = AdamConstants.from_config(3, AdamConfig(lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.5))
    assert k.decay == 1 - 0.1 * 0.5 and k.l2 == 0 and math.isclose(k.inv_bc2_sqrt, 1 / math.sqrt(1 - 0.99**3))
    assert math.isclose(k.neg_step_size, -0.1 / (1 - 0.8**3)) and math.isclose(k.w1, 0.2)
    k = AdamConstants.from_config(1, AdamConfig(weight_decay=0.5, adamw=False))
    assert k.decay == 1 and k.l2 == 0.5


def test_lerp_weight_above_one_half_takes_torchs_other_branch():
    """beta1 < 0.5 makes torch's lerp use end - (end - start)(1 - w); the kernel follows."""
    gen = torch.Generator().manual_seed(3)
    p = torch.randn(300, generator=gen)
    r = p.clone().requires_grad_()
    opt = torch.optim.AdamW([r], lr=LR, betas=(0.3, 0.999), weight_decay=WD)
    m, v = torch.zeros(300), torch.zeros(300)
    cfg = AdamConfig(lr=LR, betas=(0.3, 0.999), weight_decay=WD)
    for step in range(1, STEPS + 1):
        g = torch.randn(300, generator=gen)
        r.grad = g.clone()
        opt.step()
        adam_step(p, g, m, v, step, cfg)
    if torch.backends.cpu.get_cpu_capability() in FMA_KERNEL_SETS:
        assert torch.equal(m, opt.state[r]["exp_avg"])
    else:  # ATen's default kernels: see FMA_KERNEL_SETS
        assert (m - opt.state[r]["exp_avg"]).abs().max() <= 2**-22 * m.abs().max()
    assert_close_to_torch([p], [r])


def _four(n=5, **kw):
    return [torch.zeros(n, **kw) for _ in range(4)]


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((torch.zeros(5), torch.zeros(6), torch.zeros(5), torch.zeros(5)), {}, ValueError,
     r"grads\[0\] has shape \(6,\) where params\[0\] has \(5,\)"),
    ((torch.zeros(5).half(), *_four()[1:]), {}, TypeError, "params\\[0\\] has dtype torch.float16.*params16"),
    ((torch.zeros(5), torch.zeros(5, dtype=torch.float64), *_four()[2:]), {}, TypeError,
     r"grads\[0\] has dtype torch.float64, expected torch.float32"),
    ((torch.zeros(5), torch.zeros(5), torch.zeros(5, device="meta"), torch.zeros(5)), {}, ValueError,
     r"exp_avgs\[0\] is on meta but params\[0\] is on cpu"),
    ((torch.zeros(5, 2).t(), torch.zeros(2, 5), torch.zeros(2, 5), torch.zeros(2, 5)), {}, ValueError,
     r"params\[0\] is not contiguous"),
    (([torch.zeros(5)], [torch.zeros(5)] * 2, [torch.zeros(5)], [torch.zeros(5)]), {}, ValueError,
     "grads has 2 tensors but params has 1"),
    ((torch.zeros(5), [torch.zeros(5)], torch.zeros(5), torch.zeros(5)), {}, TypeError,
     "params is a tensor but grads is a list"),
    (([], [], [], []), {}, ValueError, "empty list"),
    ((torch.zeros(5), torch.zeros(5), torch.zeros(5), "m"), {}, TypeError, "exp_avg_sqs must be a tensor"),
    (_four(), {"params16": torch.zeros(5)}, TypeError, "params16 must be torch.bfloat16 or torch.float16"),
    (_four(), {"params16": torch.zeros(5, dtype=torch.bfloat16)}, TypeError,
     "backend 'numba' steps fp32 tensors only"),
    (_four(), {"backend": "cuda"}, ValueError, "backend 'cuda' needs CUDA tensors but they are on cpu"),
    (_four(), {"backend": "jax"}, ValueError, "unknown backend 'jax'"),
    (_four(), {"step": 0}, ValueError, "step must be an int >= 1"),
    (_four(), {"cfg": {"lr": 1e-3}}, TypeError, "cfg must be a zero_ref.optim.AdamConfig"),
])
def test_bad_inputs_are_clear_errors(args, kwargs, error, match):
    kwargs = {"step": 1, "cfg": AdamConfig(), **kwargs}
    with pytest.raises(error, match=match):
        adam_step(*args, **kwargs)


def test_cuda_extension_lists_are_built_once_per_adam_tensors():
    """The extension's step does no Python work per tensor: its lists are built on the first step."""
    from zero_ref.kernels import cuda_ext

    n = 100
    tensors = AdamTensors(*([torch.zeros(3).requires_grad_() for _ in range(n)] if i == 0 else
                            [torch.zeros(3) for _ in range(n)] for i in range(4)),
                          params16=[torch.zeros(3, dtype=torch.bfloat16) for _ in range(n)])
    lists = cuda_ext.tensor_lists(tensors)
    assert cuda_ext.tensor_lists(tensors) is lists
    assert [len(ts) for ts in lists] == [n] * 5
    held = (tensors.params, tensors.grads, tensors.exp_avgs, tensors.exp_avg_sqs, tensors.params16)
    assert all(a.data_ptr() == b.data_ptr() and not a.requires_grad
               for ts, mine in zip(held, lists) for a, b in zip(mine, ts))
    assert cuda_ext.tensor_lists(AdamTensors(*_four()))[4] == []


@pytest.mark.skipif(numba_cuda.simulator_enabled() or torch.cuda.is_available(), reason="a CUDA device is usable")
def test_numba_cuda_without_a_device_says_why():
    with pytest.raises(RuntimeError, match="backend 'numba_cuda' cannot run: no CUDA GPU"):
        adam_step(*_four(), 1, AdamConfig(), backend="numba_cuda")
    backends = available_backends()
    assert backends["torch"] == backends["numba"] == "ok" and backends["cuda"] != "ok", backends


def test_bytes_and_flops_per_parameter():
    assert roofline.adam_bytes_per_param() == 28 == 16 + 12
    assert roofline.adam_traffic("bf16", "bf16") == (4 + 2 + 4 + 4, 4 + 4 + 4 + 2)
    assert roofline.adam_bytes_per_param("fp32", "fp16") == 30
    assert roofline.unfused_adam_bytes_per_param() == 84 == 3 * 28
    assert roofline.adam_flops_per_param() == 14 and roofline.adam_flops_per_param(adamw=False) == 15
    with pytest.raises(ValueError, match="params16 is the 16-bit copy"):
        roofline.adam_traffic("fp32", "fp32")


# -- GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("backend", ["cuda", "numba_cuda"])
@pytest.mark.parametrize("adamw", [True, False], ids=["adamw", "adam_l2"])
def test_gpu_backends_match_torch(backend, adamw):
    sizes = SIZES + [3 * 8192 + 5] + [2] * 130  # > 128 tensors: the extension needs two launches
    params, ms, vs, ref, opt = run_vs_torch(sizes, backend, adamw, device="cuda")
    assert_close_to_torch(params, ref)
    # The same arithmetic as the CPU kernel: on the same inputs, CPU and GPU agree bit for bit.
    cpu, _, _, _, _ = run_vs_torch(sizes, "numba", adamw)
    if backend == "cuda":
        assert all(torch.equal(a.cpu(), b) for a, b in zip(params, cpu))


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_cuda_extension_writes_the_16bit_copy(half):
    gen = torch.Generator(device="cuda").manual_seed(0)
    # An offset view: pointers not 16-byte aligned take the scalar path.
    sizes, cfg = [1, 7, 4096, 20001], AdamConfig(lr=LR, weight_decay=WD)
    base = [torch.randn(n + 1, generator=gen, device="cuda")[1:] for n in sizes]
    grads = [torch.randn(n, generator=gen, device="cuda") for n in sizes]
    for g_dtype in (torch.float32, half):
        p, m, v = [t.clone() for t in base], [torch.zeros_like(t) for t in base], [torch.zeros_like(t) for t in base]
        p16 = [torch.empty_like(t, dtype=half) for t in base]
        q, qm, qv = [t.clone() for t in base], [torch.zeros_like(t) for t in base], [torch.zeros_like(t) for t in base]
        g = [t.to(g_dtype) for t in grads]
        for step in range(1, 4):
            adam_step(p, g, m, v, step, cfg, backend="cuda", params16=p16)
            adam_step(q, [t.float() for t in g], qm, qv, step, cfg, backend="cuda")
        assert all(torch.equal(a, b) for a, b in zip(p, q))           # the fp32 master = the fp32 kernel
        assert all(torch.equal(a, b.to(half)) for a, b in zip(p16, p))  # the copy = the master, rounded


# -- the compiled build (make cuda-ext) ----------------------------------------------------------

def test_cuda_extension_compiled_build():
    """The extension built by `make cuda-ext` (torch 2.14.1 CUDA 13 in .venv-cuda) imports and exports fused_adam."""
    python = ROOT / ".venv-cuda" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-cuda (run `make cuda-ext` to compile the CUDA extension; it needs nvcc, not a GPU)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([str(python), "-m", "zero_ref.kernels.cuda_ext", "--check"], capture_output=True,
                         text=True, env=env, timeout=120)
    if out.returncode == 3:
        pytest.skip(f"the CUDA extension is not built or older than its sources (run `make cuda-ext`): {out.stdout}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"fused_adam"' in out.stdout, out.stdout
