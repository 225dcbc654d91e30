"""course.labs.block_activations.measure_block: what a ParallelBlock saves on real ranks is Korthikanti's count
plus the LayerNorm statistics, and sequence parallelism and recomputation each keep less."""
import pytest

import zero_ref
from course.labs.block_activations import measure_block
from zero_ref.memory import activation_bytes_per_layer

MODES = [(False, "none"), (True, "none"), (True, "selective"), (True, "full")]


@pytest.mark.slow
def test_measured_bytes_are_the_formula_plus_layernorm_statistics():
    seqs, h, a, b = (32, 64), 64, 4, 2
    ranks = zero_ref.launch(measure_block, 2, seqs, MODES, h, a, b, timeout=300)
    assert ranks[0] == ranks[1]
    for s in seqs:
        for sp, rc in MODES:
            ln_stats = 0 if rc == "full" else 8 * s * b // (2 if sp else 1)
            assert ranks[0][(s, sp, rc)] == activation_bytes_per_layer(s, b, h, a, tp=2, sp=sp, recompute=rc) + ln_stats
        kept = [ranks[0][(s, sp, rc)] for sp, rc in MODES]
        assert kept == sorted(kept, reverse=True) and len(set(kept)) == len(kept)
