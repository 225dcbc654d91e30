"""``deepspeed`` as another name for zero_ref.ds, for scripts run unedited (``zero_ref.ds.run``, ``zero-ref``).

``install()`` puts one finder first on ``sys.meta_path``. It answers ``import deepspeed.X`` with the
module ``zero_ref.ds.X`` itself (one object under both names), so a script's own imports and those inside
transformers and accelerate reach zero_ref, never the real DeepSpeed. It also answers
``importlib.metadata`` for the distribution ``deepspeed`` (version 0.19.8, the API zero_ref follows), so
libraries that gate on ``find_spec("deepspeed")`` and the installed version take zero_ref, with or
without DeepSpeed installed.

What zero_ref lacks fails where the script reaches it, naming it: a module at import
(``ModuleNotFoundError``), a name at ``from deepspeed.X import name`` (``ImportError``) or at attribute use
(``AttributeError``, so ``hasattr`` still answers False), each message listing what that module provides.
"""
from __future__ import annotations

import __future__
import dis
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import pathlib
import sys
import types

PACKAGE = "zero_ref.ds"
DOCS = "docs/deepspeed_differences.md and README's \"DeepSpeed scripts on zero_ref\""

#: zero_ref.ds's own modules (no DeepSpeed module has their path): left out of the names a message lists
OWN_MODULES = {"alias", "basic_optimizer", "compat", "engine", "hf", "run", "stage0_state", "torch_backward"}


def version() -> str:
    """The DeepSpeed release whose API zero_ref.ds follows (its ``__version__``)."""
    return importlib.import_module(PACKAGE).__version__


def target(fullname: str) -> str | None:
    """``zero_ref.ds.X`` for ``deepspeed.X``; None for any other module."""
    if fullname == "deepspeed" or fullname.startswith("deepspeed."):
        return PACKAGE + fullname[len("deepspeed"):]
    return None


def deepspeed_name(name: str) -> str:
    """``deepspeed.X`` for ``zero_ref.ds.X`` (the name the script used)."""
    return "deepspeed" + name[len(PACKAGE):] if name.startswith(PACKAGE) else name


def provided(module) -> list[str]:
    """The public names ``module`` offers: its ``__all__`` (or its public globals), and its submodules."""
    names = list(getattr(module, "__all__", None)
                 or [n for n, v in vars(module).items() if not n.startswith("_")
                     and not isinstance(v, (types.ModuleType, __future__._Feature))])
    if hasattr(module, "__path__"):
        import pkgutil
        own = OWN_MODULES if module.__name__ == PACKAGE else set()
        names += [m.name for m in pkgutil.iter_modules(module.__path__) if m.name not in names and m.name not in own]
    return sorted(names)


def missing_message(module, name: str) -> str:
    where = deepspeed_name(module.__name__)
    return (f"{where}.{name}: zero_ref runs this script in place of DeepSpeed {version()} and has no "
            f"{name!r} in {where}; it provides {', '.join(provided(module)) or 'nothing else'} there "
            f"(what zero_ref supports and refuses: {DOCS})")


def _importing_from() -> bool:
    """True when the caller two frames up is executing ``from module import name``."""
    frame = sys._getframe(2)
    return dis.opname[frame.f_code.co_code[frame.f_lasti]] == "IMPORT_FROM"


def guard(module) -> None:
    """Give ``module`` a ``__getattr__`` for names it lacks: a submodule of a package is imported (as
    DeepSpeed's package imports its own); any other name fails with ``missing_message``."""
    original = module.__dict__.get("__getattr__")
    if getattr(original, "guards", None) is module:
        return

    def __getattr__(name: str):
        if original is not None:
            try:
                found = original(name)
            except AttributeError:
                pass
            else:
                if isinstance(found, types.ModuleType) and found.__name__.startswith(PACKAGE):
                    guard(found)
                return found
        if name.startswith("_"):  # probes such as __path__ or _is_coroutine: plain, cheap answers
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        if hasattr(module, "__path__") and importlib.util.find_spec(f"{module.__name__}.{name}") is not None:
            sub = importlib.import_module(f"{module.__name__}.{name}")
            guard(sub)
            return sub
        raise (ImportError if _importing_from() else AttributeError)(missing_message(module, name))

    __getattr__.guards = module
    module.__getattr__ = __getattr__


class _Distribution(importlib.metadata.Distribution):
    """The ``deepspeed`` distribution, as zero_ref.ds: its metadata names DeepSpeed's version."""

    def read_text(self, filename):
        if filename != "METADATA":
            return None
        return (f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {version()}\n"
                "Summary: zero_ref.ds, answering for DeepSpeed's API (zero_ref.ds.alias)\n")

    def locate_file(self, path):
        return pathlib.Path(__file__).parent / path


class _Guarded(importlib.abc.Loader):
    """A zero_ref.ds module's own loader, then ``guard``: the module answers missing names as ``deepspeed.*``."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        guard(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class DeepSpeedAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``deepspeed.*`` with the module of the same path under zero_ref.ds (imports and metadata), and
    guards each zero_ref.ds module loaded from then on."""

    def find_spec(self, fullname, path=None, target_=None):
        if fullname.startswith(PACKAGE + "."):
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _Guarded(spec.loader)
            return spec
        ours = target(fullname)
        if ours is None:
            return None
        try:
            spec = importlib.util.find_spec(ours)
        except ModuleNotFoundError:  # its parent is a module, not a package
            spec = None
        if spec is None:
            parent = importlib.import_module(ours.rpartition(".")[0])
            raise ModuleNotFoundError(missing_message(parent, ours.rpartition(".")[2]).replace(
                "has no", "has no module", 1), name=fullname)
        return importlib.util.spec_from_loader(fullname, self, is_package=spec.submodule_search_locations is not None)

    def create_module(self, spec):
        module = importlib.import_module(target(spec.name))  # the same module object under both names
        guard(module)
        return module

    def exec_module(self, module):
        pass  # executed already, as zero_ref.ds.*

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = context.name
        if name is None or name.lower().replace("_", "-") == "deepspeed":
            yield _Distribution()


def install() -> None:
    """Make ``deepspeed`` mean zero_ref.ds in this process (idempotent); drops a real DeepSpeed already imported."""
    if not any(isinstance(f, DeepSpeedAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, DeepSpeedAlias())
    for name, module in list(sys.modules.items()):
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            guard(module)
    for name in [n for n in sys.modules if target(n) is not None]:
        if not getattr(sys.modules[name], "__name__", "").startswith(PACKAGE):
            del sys.modules[name]
