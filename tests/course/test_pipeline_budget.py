"""Activation memory of pipeline plans: one sequence's bytes per chunk, walked along a schedule's order, predict the
peak a real pipeline measures on every stage."""
import pytest

import zero_ref
from course.labs.pipeline_budget import plan_peaks, sequence_bytes
from zero_ref.models import GPTConfig
from zero_ref.parallel.schedules import stage_order

CFG = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=4)


def predicted(seq, schedule, p, v, m, batch, s):
    held = top = 0
    for kind, _, c in stage_order(schedule, p, m, s, v):
        held += (1 if kind == "F" else -1) * (batch // m) * seq[v][s][c]
        top = max(top, held)
    return top


def test_sequence_bytes_has_one_entry_per_chunk_and_the_last_stage_holds_the_head():
    seq = sequence_bytes(CFG, 2, 2)
    assert [len(row) for row in seq] == [2, 2]
    assert seq[1][1] > seq[1][0] and all(b > 0 for row in seq for b in row)  # virtual stage 3 computes the logits


@pytest.mark.slow
def test_walking_the_order_predicts_the_measured_peaks_on_two_ranks():
    plans = [("gpipe", 1, 4), ("1f1b", 1, 4), ("interleaved", 2, 4)]
    batch = 8
    seq = {v: sequence_bytes(CFG, 2, v) for v in (1, 2)}
    ranks = zero_ref.launch(plan_peaks, 2, CFG, plans, batch, timeout=300)
    for schedule, v, m in plans:
        for s, r in enumerate(ranks):
            want = predicted(seq, schedule, 2, v, m, batch, s)
            assert abs(r[schedule, v, m] - want) <= 0.005 * want, (schedule, s, r[schedule, v, m], want)
    assert ranks[0]["1f1b", 1, 4] < ranks[0]["gpipe", 1, 4]  # 1F1B holds 2 micro-batches on stage 0, GPipe 4
