"""A pipeline stage that sleeps: forward t_f, backward t_b + t_w, and a gradient that still flows."""
import time

import torch

from course.labs.sleeping_stage import SleepStage


def test_forward_and_backward_sleep_their_times_and_the_weight_gets_a_gradient():
    stage = SleepStage(0.05, 0.03, 0.04, d=3)
    assert stage.activation_shape(2, 5) == (2, 5, 3)
    start = time.perf_counter()
    loss = stage(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
    forward = time.perf_counter() - start
    start = time.perf_counter()
    loss.backward()
    backward = time.perf_counter() - start
    assert loss.dim() == 0 and 0.05 <= forward < 0.5 and 0.07 <= backward < 0.5
    assert stage.w.grad is not None and stage.w.grad.shape == (3,)
    hidden = stage(torch.ones(2, 5, 3))  # a middle stage: activations in, activations out
    assert hidden.shape == (2, 5, 3) and torch.equal(hidden, torch.ones(2, 5, 3))
