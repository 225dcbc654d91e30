"""course.show: the source the chapters print, whole or as an excerpt, and what it refuses."""
import inspect

import pytest
import torch

from course.show import show, source
from zero_ref.stages.flat import FlatLayout, Piece
from zero_ref.offload import OptimizerOffload
from zero_ref.parallel.schedules import warmup_count

WARMUP_COUNT = '''\
def warmup_count(schedule: str, stages: int, microbatches: int, stage: int, virtual: int = 1) -> int:
    """Forwards stage s runs before its first backward: GPipe m; 1F1B and ZB-H1 p − s − 1; interleaved
    2(p − s − 1) + (v − 1)·p (Megatron's count); never more than the v·m forwards it has."""
    p, m, v, s = stages, microbatches, virtual, stage
    if schedule == "gpipe":
        return m
    if schedule in ("1f1b", "zb-h1"):
        return min(p - s - 1, m)
    return min(2 * (p - s - 1) + (v - 1) * p, v * m)
'''


def test_a_function_is_printed_as_written_then_a_blank_line(capsys):
    show(warmup_count)
    assert capsys.readouterr().out == WARMUP_COUNT + "\n"


def test_without_the_docstring_its_lines_are_gone():
    lines = WARMUP_COUNT.splitlines(keepends=True)
    assert source(warmup_count, docstring=False) == "".join(lines[:1] + lines[3:])


def test_an_excerpt_runs_from_the_start_line_up_to_the_until_line():
    assert source(warmup_count, start='if schedule in ("1f1b", "zb-h1")', until="return min(2") == (
        '    if schedule in ("1f1b", "zb-h1"):\n'
        '        return min(p - s - 1, m)\n')
    # until alone cuts from the top (the signature); start alone runs to the end
    assert source(warmup_count, until='"""') == WARMUP_COUNT.splitlines(keepends=True)[0]
    assert source(warmup_count, start="return min(2") == "    return min(2 * (p - s - 1) + (v - 1) * p, v * m)\n"


def test_an_excerpt_drops_the_blank_lines_before_the_cut_and_the_docstring_goes_first():
    text = source(OptimizerOffload.step, until="grad_of =", docstring=False)
    assert text.startswith("    def step(self, opt, grads: list[torch.Tensor]) -> None:\n        step = opt.adam_steps\n")
    assert text.endswith("            return\n") and '"""' not in text and "grad_of" not in text


def test_markers_that_do_not_pin_one_line_raise_naming_the_object_and_the_marker():
    with pytest.raises(ValueError, match=r"warmup_count.*'no such line'.*0 lines"):
        source(warmup_count, start="no such line")
    with pytest.raises(ValueError, match=r"warmup_count.*'return'.*3 lines"):
        source(warmup_count, start="return")
    with pytest.raises(ValueError, match=r"warmup_count.*'gpipe'"):  # only before the start
        source(warmup_count, start='if schedule in ("1f1b", "zb-h1")', until="gpipe")
    with pytest.raises(ValueError, match=r"Piece.numel.*no docstring"):
        source(Piece.numel, docstring=False)


def test_a_method_and_a_property_keep_their_indentation_in_the_class():
    assert source(Piece.numel) == (
        "    @property\n"
        "    def numel(self) -> int:\n"
        "        return self.param_end - self.param_start\n")
    init = source(FlatLayout.__init__)
    assert init.startswith("    def __init__(self, shapes") and init == inspect.getsource(FlatLayout.__init__)


def test_a_class_is_printed_with_its_decorator_and_methods():
    text = source(Piece)
    assert text.startswith("@dataclass(frozen=True)\nclass Piece:\n")
    assert text.endswith("        return self.param_end - self.param_start\n")
    assert '"""The part of parameter' not in source(Piece, docstring=False)


def test_a_numba_kernel_shows_its_python_function():
    numba_cpu = pytest.importorskip("zero_ref.kernels.numba_cpu")
    assert source(numba_cpu.adam_chunk) == inspect.getsource(numba_cpu.adam_chunk.py_func)


@pytest.mark.parametrize("obj", [torch.nn.Linear.forward, len, lambda: None], ids=["torch", "builtin", "test"])
def test_only_the_course_packages_are_shown(obj):
    with pytest.raises(TypeError, match="zero_ref, sim, course"):
        show(obj)
