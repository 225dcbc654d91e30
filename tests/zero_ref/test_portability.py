"""The second pass of the test run (`make test-portable`) computes on another instruction set, for real.

It sets ATEN_CPU_CAPABILITY=default (ATen's portable kernels instead of AVX2 / AVX-512) and
MKL_CBWR=COMPATIBLE (MKL's reproducible code path for matrix products). Stored notebook outputs and test
tolerances that depend on the CPU fail there. These tests show the pass is not vacuous: the same GPT step
gives other bits with those variables, and values that agree to rounding.
"""
import os
import subprocess
import sys

import pytest
import torch

OTHER_SET = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}

PROBE = """
import hashlib, torch
from zero_ref.models import GPT, GPTConfig, make_batch
torch.manual_seed(0)
cfg = GPTConfig()
model = GPT(cfg)
idx, targets = make_batch(cfg, batch_size=4, seed=0)
loss = model(idx, targets)[1]
loss.backward()
grads = torch.cat([p.grad.flatten() for p in model.parameters()])
print(torch.backends.cpu.get_cpu_capability(), loss.item().hex(), grads.double().abs().sum().item().hex(),
      hashlib.sha256(grads.numpy().tobytes()).hexdigest())
"""


def gpt_step(env: dict) -> tuple[str, float, float, str]:
    """(ATen's kernel set, loss, sum |gradient|, sha256 of the gradient's bytes) of one course-GPT step."""
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    capability, loss, grad_l1, digest = out.stdout.split()
    return capability, float.fromhex(loss), float.fromhex(grad_l1), digest


def test_the_other_instruction_set_changes_the_bits_not_the_values():
    native_env = {k: v for k, v in os.environ.items() if k not in OTHER_SET}
    native = gpt_step(native_env)
    if native[0] == "DEFAULT":
        pytest.skip("this CPU's native kernels are ATen's default set already: here the second pass repeats the first")
    other = gpt_step(native_env | OTHER_SET)
    assert other[0] == "DEFAULT"
    assert other[3] != native[3], "the same gradient bits on both instruction sets: the portability pass tests nothing"
    # ... and the values agree to what fp32 rounding in another summation order allows
    assert other[1] == pytest.approx(native[1], rel=1e-5)
    assert other[2] == pytest.approx(native[2], rel=1e-5)


def test_this_run_computes_on_the_instruction_set_it_names():
    """Under `make test-portable` (ZERO_LAB_PORTABLE=1) this process, and so every rank and notebook kernel it
    starts, runs ATen's default kernels."""
    if os.environ.get("ZERO_LAB_PORTABLE") != "1":
        pytest.skip("the native pass: the other instruction set is make test-portable's")
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
    assert all(os.environ.get(k) == v for k, v in OTHER_SET.items())
