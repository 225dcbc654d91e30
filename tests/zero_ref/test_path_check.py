"""ZeRO-3's same-path check (zero_ref/stages/zero3/path_check.py) on 2 real gloo ranks, with scripted paths.

Each "collective" is an all-gather of its unit's size (units of different sizes: a mismatch that reached
gloo would abort the process). A rank whose path differs from the others' must make every rank raise the
same error, naming what each did where they part, whether headers are exchanged before each collective
(no order known yet) or only at the micro-step's end (the micro-step repeats the last one), and whether
the rank leaves the path, ends early or runs longer. On the path, only the end header is sent.
"""
import pytest
import torch

import zero_ref
from zero_ref import comm
from zero_ref.stages.zero3.path_check import END, PathCheck

SIZES = [3, 5, 7, 11]  # elements per rank of unit i's collective
PATH = [(0, 0), (1, 0), (2, 0), (3, 0), (3, 3), (2, 3)]  # (unit, op) of one micro-step


def explain(did):
    return "paths differ: " + " while ".join(f"rank {r} at {key}" for r, key in enumerate(did))


def collective(key):
    shard = torch.full((SIZES[key[0]],), float(comm.get_rank()))
    return comm.all_gather(torch.empty(2 * shard.numel()), shard, async_op=True)


def walk(rank, world, paths):
    """Micro-steps along ``paths[rank]`` (a list of micro-steps); what each micro-step did, or the error."""
    path = PathCheck(None, world, "cpu", collective, same=lambda a, b: a == b, explain=explain)
    done = []
    for micro, keys in enumerate(paths[rank]):
        try:
            ahead = path.expected is not None
            for key in keys:
                path.announce(key)
                collective(key).wait()
            path.end(keep=True)
        except RuntimeError as e:
            return done, str(e)
        done.append("ahead" if ahead else "checked")
    return done, None


def run(paths):
    return zero_ref.launch(walk, 2, paths, timeout=60)


@pytest.mark.slow
def test_on_the_path_one_header_per_micro_step():
    results = run([[PATH] * 3, [PATH] * 3])
    assert results == [(["checked", "ahead", "ahead"], None)] * 2
    headers = zero_ref.launch(count_headers, 2, timeout=60)
    assert headers == [[len(PATH) + 1, 1, 1]] * 2  # a header before each collective + the end one, then the end one only


def count_headers(rank, world):
    path = PathCheck(None, world, "cpu", collective, same=lambda a, b: a == b, explain=explain)
    counts = []
    for _ in range(3):
        with comm.recording() as log:
            for key in PATH:
                path.announce(key)
                collective(key).wait()
            path.end(keep=True)
        counts.append(sum(r.dtype == "int64" for r in log.records))
    return counts


LEAVES = PATH[:2] + [(3, 0), (3, 3), (2, 3)]           # skips unit 2: a different size next
ENDS_EARLY = PATH[:4]                                   # no backward collectives
RUNS_LONGER = PATH + [(1, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("other, rows", [
    (LEAVES, "rank 0 at (2, 0) while rank 1 at (3, 0)"),
    (ENDS_EARLY, f"rank 0 at (3, 3) while rank 1 at {END}"),
    (RUNS_LONGER, f"rank 0 at {END} while rank 1 at (1, 3)"),
], ids=["leaves", "ends_early", "runs_longer"])
@pytest.mark.parametrize("micro", [0, 2], ids=["checked", "ahead"])
def test_a_rank_off_the_path_raises_the_same_error_on_every_rank(other, rows, micro):
    results = run([[PATH] * 3, [PATH] * micro + [other]])
    done = ["checked", "ahead"][:micro]
    assert results == [(done, "paths differ: " + rows)] * 2


@pytest.mark.slow
def test_every_rank_changing_path_alike_is_no_error():
    """Both ranks switch to a new path at once (after the path repeated): no error; the check goes back to
    exchanging headers first for that micro-step and, once the new path repeats, sends them ahead again."""
    new = [PATH] * 2 + [LEAVES] * 3
    results = run([new, new])
    assert results == [(["checked", "ahead", "ahead", "checked", "ahead"], None)] * 2
