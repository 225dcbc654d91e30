"""The fused multi-tensor Adam(W) CUDA extension (``csrc/fused_adam.cu``), built on first use.

``load()`` compiles ``csrc/fused_adam.cpp`` (g++) and ``csrc/fused_adam.cu`` (nvcc) with
``torch.utils.cpp_extension.load`` into a per-torch-build folder under the torch extensions
cache, and imports it; later calls (and later processes) reuse the build while the sources are
unchanged. Compiling needs the CUDA toolkit (``CUDA_HOME``) and a CUDA build of torch, not a
GPU: ``make cuda-ext`` runs ``python -m zero_ref.kernels.cuda_ext --build`` in such an
environment. ``TORCH_CUDA_ARCH_LIST`` picks the architectures (e.g. ``9.0`` for Hopper).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

NAME = "zero_ref_fused_adam"
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (CSRC / "fused_adam.cpp", CSRC / "fused_adam.cu")
CFLAGS = ["-O3"]
CUDA_CFLAGS = ["-O3", "--expt-relaxed-constexpr"]  # IEEE sqrt/div: no --use_fast_math
_module = None


def build_directory() -> Path:
    """Where this torch build's compiled extension lives (one folder per torch version + CUDA)."""
    import torch

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    tag = re.sub(r"[^A-Za-z0-9.]+", "_", f"torch{torch.__version__}")
    return Path(root) / f"{NAME}_{tag}"


def unavailable_reason() -> str | None:
    """None when the extension can be built and run here, else why not."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (the extension needs a CUDA build of torch)"
    if not torch.cuda.is_available():
        return "no CUDA GPU (the extension compiles without one: make cuda-ext)"
    return None


def load(verbose: bool = False):
    """Build (first time) and import the extension module."""
    global _module
    if _module is None:
        import torch
        from torch.utils.cpp_extension import load as _load

        if torch.version.cuda is None:
            raise RuntimeError(unavailable_reason())
        folder = build_directory()
        folder.mkdir(parents=True, exist_ok=True)
        _module = _load(name=NAME, sources=[str(s) for s in SOURCES], extra_cflags=CFLAGS,
                        extra_cuda_cflags=CUDA_CFLAGS, build_directory=str(folder), verbose=verbose)
    return _module


def tensor_lists(tensors) -> list[list]:
    """The extension's five lists for an ``AdamTensors``, detached, built on its first step and kept
    in its cache: a step then does no Python work per tensor (with 100 tensors, rebuilding the lists
    on every step costs more host time than the kernel takes at 16M parameters)."""
    lists = tensors._cache.get("cuda_lists")
    if lists is None:
        lists = [[t.detach() for t in ts] for ts in (tensors.params, tensors.grads, tensors.exp_avgs,
                                                      tensors.exp_avg_sqs, tensors.params16 or [])]
        tensors._cache["cuda_lists"] = lists
    return lists


def step(tensors, k) -> None:
    """Step an ``AdamTensors`` on CUDA with constants ``k`` (``AdamConstants``)."""
    if _module is None:  # checked once: the first step either loads the extension or says why it cannot
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"backend 'cuda' cannot run: {reason}")
    load().fused_adam(tensor_lists(tensors), *k)


def built_library() -> Path | None:
    """The compiled extension, if it exists and is newer than its sources."""
    so = build_directory() / f"{NAME}.so"
    if so.exists() and so.stat().st_mtime >= max(s.stat().st_mtime for s in SOURCES):
        return so
    return None


def excerpt(first: str, last: str, source: Path = SOURCES[1]) -> str:
    """Lines of the CUDA source from the first line containing ``first`` through the next line
    containing ``last`` (for printing next to the Numba kernels)."""
    lines = source.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    stop = next(i for i in range(start + 1, len(lines)) if last in lines[i])
    return "\n".join(lines[start:stop + 1])


def _main(argv: list[str]) -> int:
    import torch

    if "--build" in argv:
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "(torch's default)")
        print(f"building {NAME}: torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"CUDA_HOME={os.environ.get('CUDA_HOME', '(unset)')}, TORCH_CUDA_ARCH_LIST={arch}", flush=True)
        t0 = time.perf_counter()
        module = load(verbose=True)
        print(f"built {build_directory() / (NAME + '.so')} in {time.perf_counter() - t0:.1f} s; "
              f"exports: {', '.join(n for n in dir(module) if not n.startswith('_'))}")
        return 0
    if "--check" in argv:
        so = built_library()
        info = {"torch": torch.__version__, "cuda": torch.version.cuda, "library": str(so) if so else None}
        if so:  # import the built library itself: load() would rebuild for another TORCH_CUDA_ARCH_LIST
            import importlib.util

            spec = importlib.util.spec_from_file_location(NAME, so)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            info["exports"] = sorted(n for n in dir(module) if not n.startswith("_"))
        print(json.dumps(info))
        return 0 if so else 3
    print("usage: python -m zero_ref.kernels.cuda_ext --build | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
