"""course.labs.gradient_buckets: the rules and one-process references chapter 4's checks hold answers to."""
import torch

from course.labs.gradient_buckets import exercise_grads, launches_due, summed_gradients
from zero_ref.models import GPT, GPTConfig, make_batch


def test_a_bucket_is_due_once_it_and_every_bucket_before_it_are_complete():
    buckets = [[5, 4], [3, 2], [1, 0]]
    assert launches_due(buckets, [5, 4, 3, 2, 1, 0]) == [0, 1, 1, 2, 2, 3]
    assert launches_due(buckets, [0, 3, 1, 2, 5, 4]) == [0, 0, 0, 0, 0, 3]   # bucket 0 last: nothing goes before
    assert launches_due([[0], [1]], [1, 0]) == [0, 2]


def test_exercise_grads_are_the_same_on_every_call_and_differ_by_rank():
    a, b, other = exercise_grads([4, 7], 0), exercise_grads([4, 7], 0), exercise_grads([4, 7], 1)
    assert [t.shape for t in a] == [(4,), (7,)]
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not torch.equal(a[0], other[0])


def test_summed_gradients_are_the_gradient_of_the_summed_loss():
    cfg = GPTConfig(vocab_size=97, seq_len=16, d_model=27, n_heads=3, n_layers=2)
    params, total = summed_gradients(cfg, micro_batches=3, micro=2)
    torch.manual_seed(0)
    net = GPT(cfg)
    idx, targets = make_batch(cfg, 6, seed=7)
    loss = sum(net(idx[k:k + 2], targets[k:k + 2])[1] for k in (0, 2, 4))
    loss.backward()
    scale = max(p.grad.abs().max().item() for p in net.parameters())
    for p, q in zip(params, net.parameters()):
        assert p.shape == q.shape
        assert (total[id(p)] - q.grad).abs().max().item() <= 1e-6 * scale
