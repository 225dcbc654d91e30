"""Print the library's own code in a notebook: the one way chapters show source.

    show(ZeroStage3.fetch)                           # a function or method, as written (indentation kept)
    show(S.FP16Config)                               # a class; a property shows its getter
    show(OptimizerOffload.step, docstring=False)     # without the docstring
    show(OptimizerOffload.step, until="grad_of =")   # from the top up to, not including, that line
    show(ZeroOptimizerBase.step, start="for b, g in zip", until="self.publish_params()")
    text = source(numba_cuda.adam_kernel)            # the same text as a string (numba: its Python function)

``start`` names the first line shown and must occur on exactly one line; ``until`` names the first line
left out, the next one after ``start`` that contains it. A marker that does not match raises
ValueError, so a chapter fails loudly when the code it quotes changes. Only code of the course's own
packages is shown: a notebook that quotes torch would freeze someone else's source in its outputs.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

PACKAGES = ("zero_ref", "sim", "course")


def source(obj, *, start: str | None = None, until: str | None = None, docstring: bool = True) -> str:
    """The source text that ``show`` prints (ends with a newline)."""
    target = _target(obj)
    name = getattr(target, "__qualname__", repr(obj))
    lines = inspect.getsource(target).splitlines(keepends=True)
    if not docstring:
        lines = _without_docstring(lines, name)
    if start is None and until is None:
        return "".join(lines)
    first = 0
    if start is not None:
        hits = [i for i, line in enumerate(lines) if start in line]
        if len(hits) != 1:
            raise ValueError(f"show({name}): start={start!r} is on {len(hits)} lines, not exactly one")
        first = hits[0]
    stop = len(lines)
    if until is not None:
        stop = next((i for i in range(first + 1, len(lines)) if until in lines[i]), None)
        if stop is None:
            raise ValueError(f"show({name}): until={until!r} is not on any line after the start")
    excerpt = "".join(lines[first:stop]).rstrip()  # the blank lines before the cut are not part of it
    return excerpt + "\n"


def show(obj, *, start: str | None = None, until: str | None = None, docstring: bool = True) -> None:
    """Print the source of ``obj`` (see the module docstring), followed by a blank line."""
    print(source(obj, start=start, until=until, docstring=docstring))


def _target(obj):
    """What to read the source of: a property's getter, a numba dispatcher's Python function."""
    if isinstance(obj, property):
        obj = obj.fget
    obj = getattr(obj, "py_func", obj)
    module = inspect.getmodule(obj)
    package = module.__name__.partition(".")[0] if module else None
    if package not in PACKAGES:
        raise TypeError(f"show() prints the course's own code ({', '.join(PACKAGES)}); "
                        f"{obj!r} comes from {module.__name__ if module else 'no module'}")
    return obj


def _without_docstring(lines: list[str], name: str) -> list[str]:
    """``lines`` less the lines of the docstring (the first statement of the body, if a string)."""
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = tree.body[0]
    body = getattr(node, "body", [])
    first = body[0] if body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        raise ValueError(f"show({name}, docstring=False): it has no docstring")
    return lines[:first.lineno - 1] + lines[first.end_lineno:]
