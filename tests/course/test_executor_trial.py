"""Chapter 20's trial of a hand-written pipeline executor: a right one (GPipe order, blocking messages) matches
one process and its order is recorded; one that forgets to average over micro-batches does not."""
import pytest
import torch

import zero_ref
from course.labs.executor_trial import accumulated_reference, run_executor
from zero_ref import comm
from zero_ref.models import GPTConfig
from zero_ref.parallel.schedules import stage_order

CFG = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, tie_embeddings=False)
M = 3


def gpipe(stage, s, p, micro_batches, shape, scale=True):
    """Every forward, then every backward in reverse: blocking messages meet a posted receive in this order."""
    m, held, losses = len(micro_batches), [], []
    for idx, targets in micro_batches:
        x = idx
        if s > 0:
            x = torch.empty(shape)
            comm.recv(x, s - 1)
            x.requires_grad_()
        out = stage(x, targets if s == p - 1 else None)
        if s == p - 1:
            losses.append(out.item())
            out = out / m if scale else out
        else:
            comm.send(out.detach(), s + 1)
        held.append((x, out))
    for x, out in reversed(held):
        grad = None
        if s < p - 1:
            grad = torch.empty(shape)
            comm.recv(grad, s + 1)
        torch.autograd.backward(out, grad)
        if s > 0:
            comm.send(x.grad, s - 1)
    return losses


def unscaled(*args):
    return gpipe(*args, scale=False)


@pytest.mark.slow
def test_a_right_executor_matches_one_process_and_a_wrong_one_does_not():
    want_losses, want = accumulated_reference(CFG, M)
    ranks = zero_ref.launch(run_executor, 2, gpipe, CFG, M, timeout=120, echo=False)
    for s, r in enumerate(ranks):
        assert r["ops"] == stage_order("gpipe", 2, M, s)
    assert ranks[-1]["losses"] == pytest.approx(want_losses, rel=1e-6)
    grads = {k: g for r in ranks for k, g in r["grads"].items()}
    assert set(grads) == set(want)
    for k, g in grads.items():
        torch.testing.assert_close(g, want[k], rtol=1e-5, atol=1e-7)
    wrong = zero_ref.launch(run_executor, 2, unscaled, CFG, M, timeout=120, echo=False)
    wrong_grads = {k: g for r in wrong for k, g in r["grads"].items()}
    assert not all(torch.allclose(g, want[k], rtol=1e-5, atol=1e-7) for k, g in wrong_grads.items())
