"""Old module paths, kept for one release: ``import zero_ref.flat`` still works and warns.

The root was grouped into wings (config/, parallel/, stages/, checkpoint/, offload/, profiling/).
Notebooks and scripts written against the flat root hold lines such as ``from zero_ref.flat import
FlatLayout``; this finder answers each old name with the module at its new home (the same module
object, so classes, isinstance and pickles agree) and a DeprecationWarning that names the new path.
Delete an entry, and then this file, once no hand-in uses the old names.

``KEPT`` holds names that stay, without a warning: ``zero_ref.checkpointing`` is the activation
checkpointing module under DeepSpeed's name (``deepspeed.checkpointing``).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import warnings

#: old dotted name -> new dotted name
MOVED = {
    "zero_ref.config_schema": "zero_ref.config.schema",
    "zero_ref.config_rules": "zero_ref.config.rules",
    "zero_ref.batch": "zero_ref.config.batch",
    "zero_ref.topology": "zero_ref.parallel.topology",
    "zero_ref.schedules": "zero_ref.parallel.schedules",
    "zero_ref.flat": "zero_ref.stages.flat",
    "zero_ref.zero_init": "zero_ref.stages.zero3.init",
    "zero_ref.nvme": "zero_ref.offload.nvme",
    "zero_ref.profile": "zero_ref.profiling.profile",
    "zero_ref.torch_trace": "zero_ref.profiling.torch_trace",
    "zero_ref.trial": "zero_ref.profiling.trial",
}

#: DeepSpeed's names for modules that zero_ref names after what they do: aliases for good, not deprecated
KEPT = {
    "zero_ref.checkpointing": "zero_ref.activation_checkpointing",
}

# Frames to look past when pointing the warning at the line that named the old path (the package's
# __getattr__ answers `zero_ref.flat` through this finder too).
_OURS = ("<frozen importlib", __file__, importlib.__file__, os.path.join(os.path.dirname(__file__), "__init__.py"))


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED and fullname not in KEPT:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = KEPT.get(spec.name)
        if new is None:
            new = MOVED[spec.name]
            _warn_caller(f"{spec.name} moved to {new}; import {new} instead (the old name goes next release)")
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # the import system stamped the old name's spec on the module: give it back its own
        module.__spec__ = module.__spec__.loader_state


def _warn_caller(message: str) -> None:
    """A DeprecationWarning attributed to the first frame outside the import machinery, as the user's own."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_OURS):
        frame = frame.f_back
    g = frame.f_globals
    warnings.warn_explicit(message, DeprecationWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=g.get("__name__"), registry=g.setdefault("__warningregistry__", {}))


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
