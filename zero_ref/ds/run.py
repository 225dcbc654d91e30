"""Run a DeepSpeed script on zero_ref, unedited: ``deepspeed`` and every ``deepspeed.*`` import resolve to zero_ref.ds.

    torchrun --nproc_per_node=2 -m zero_ref.ds.run train.py --deepspeed_config ds.json
    torchrun --nproc_per_node=2 -m zero_ref.ds.run -m package.module --deepspeed_config ds.json

An import hook (``DeepSpeedAlias``) is installed before the script runs, so ``import deepspeed``,
``from deepspeed import comm as dist``, ``from deepspeed.ops.adam import FusedAdam`` and the
``import deepspeed`` inside transformers and accelerate all reach zero_ref's modules: ``deepspeed.X``
*is* ``zero_ref.ds.X``. A module zero_ref does not have fails at import, naming it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import runpy
import sys

PACKAGE = "zero_ref.ds"


def _target(fullname: str) -> str | None:
    """``zero_ref.ds.X`` for ``deepspeed.X``; None for any other module."""
    if fullname == "deepspeed" or fullname.startswith("deepspeed."):
        return PACKAGE + fullname[len("deepspeed"):]
    return None


class DeepSpeedAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta-path finder that answers ``deepspeed.*`` with the module of the same path under zero_ref.ds."""

    def find_spec(self, fullname, path=None, target=None):
        ours = _target(fullname)
        if ours is None:
            return None
        spec = importlib.util.find_spec(ours)
        if spec is None:
            raise ModuleNotFoundError(
                f"{fullname}: zero_ref runs this script in place of DeepSpeed and has no module {ours}; "
                f"the DeepSpeed modules it provides are under zero_ref/ds/ (see docs/deepspeed_differences.md)",
                name=fullname)
        return importlib.util.spec_from_loader(fullname, self, is_package=spec.submodule_search_locations is not None)

    def create_module(self, spec):
        return importlib.import_module(_target(spec.name))  # the same module object under both names

    def exec_module(self, module):
        pass  # executed already, as zero_ref.ds.*


def install() -> None:
    """Make ``deepspeed`` mean zero_ref.ds in this process (idempotent); drops a real DeepSpeed already imported."""
    if not any(isinstance(f, DeepSpeedAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, DeepSpeedAlias())
    for name in [n for n in sys.modules if _target(n) is not None]:
        if not getattr(sys.modules[name], "__name__", "").startswith(PACKAGE):
            del sys.modules[name]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    install()
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("zero_ref.ds.run: -m needs a module name")
        sys.argv = argv[1:]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        if not os.path.isfile(script):
            raise SystemExit(f"zero_ref.ds.run: no script {script!r}")
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
