"""Chapters use zero_ref, sim and course through their public names only, and never patch them: a private
name the course teaches is a name the library must keep (so it is public), and a notebook that assigns to a
library attribute changes the library for every later cell."""
import ast

import nbformat
import pytest

from tests.helpers import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("ch*.ipynb"))
OURS = ("zero_ref", "sim", "course")
# private names of torch and the standard library that chapters read on purpose
# (autograd's saved tensors, a module's hook dict, namedtuple's documented methods)
THEIRS = ("_saved_", "_forward_hooks", "_backward_hooks", "_asdict", "_replace", "_fields")


def code(cell) -> ast.Module:
    lines = [ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


def offences(path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    ours: set[str] = set()  # names the notebook bound by importing from our packages
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tree = code(cell)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                for alias in node.names:
                    source = module or alias.name
                    if source.split(".")[0] in OURS:
                        ours.add((alias.asname or alias.name).split(".")[0])
                        if alias.name.startswith("_"):
                            found.append(f"{cell.id}: imports the private {source}.{alias.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not node.attr.startswith(THEIRS)
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append(f"{cell.id}: uses the private name {ast.unparse(node)}")
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                root = target
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in ours:
                    found.append(f"{cell.id}: assigns to the library attribute {ast.unparse(target)}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapters_use_only_public_names_and_patch_nothing(path):
    assert not offences(path), "\n".join(offences(path))


def test_the_check_sees_a_private_name_and_a_patch(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from zero_ref import comm\nfrom zero_ref.stages import base",
                                          id="imports"),
                nbformat.v4.new_code_cell("comm.all_gather = print\nbase.ZeroOptimizerBase._launch_ready\n"
                                          "from sim.cost import _hidden", id="misuse")]
    path = tmp_path / "ch99_x.ipynb"
    nbformat.write(nb, path)
    assert sorted(offences(path)) == ["misuse: assigns to the library attribute comm.all_gather",
                                      "misuse: imports the private sim.cost._hidden",
                                      "misuse: uses the private name base.ZeroOptimizerBase._launch_ready"]
