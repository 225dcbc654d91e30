"""Find the first tensor that held inf or nan: in forward order, in backward order, or at rest.

Divergence in mixed precision starts at one tensor: a module output beyond fp16's 65504, a
gradient times the loss scale that overflows, a weight that a too-large learning rate blew up.
Everything after it is inf/nan too, so the *first* one is the diagnosis. ``detect_anomalies``
hooks every module's output (forward hooks fire in completion order: a submodule before its
parent, so the first hit is the innermost module that produced it) and every output's and
parameter's gradient (in the order backward produces them). With an fp16 loss scaler it also
records, each time the scaler skips a step for overflow, which tensor it was.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch



def _kind(t: torch.Tensor) -> str | None:
    """'nan', 'inf', 'inf and nan' or None (finite)."""
    if not torch.is_floating_point(t) or bool(torch.isfinite(t).all()):
        return None
    nan, inf = bool(torch.isnan(t).any()), bool(torch.isinf(t).any())
    return "inf and nan" if nan and inf else "nan" if nan else "inf"


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return [t for v in x.values() for t in _tensors(v)] if isinstance(x, Mapping) else []


@dataclass(frozen=True)
class Finding:
    """A tensor holding inf/nan: ``what`` (forward output, output gradient, parameter, ...) of ``name``."""

    what: str
    name: str
    kind: str
    shape: tuple
    note: str = ""

    def __str__(self) -> str:
        text = f"{self.what} of {self.name}: {self.kind}, shape {list(self.shape)}"
        return f"{text}; {self.note}" if self.note else text


def find_nonfinite(module: torch.nn.Module, loss: torch.Tensor | None = None) -> Finding | None:
    """The first tensor holding inf/nan among the parameters, buffers (nan only), gradients (registration
    order), then ``loss``; None if all are finite. Under ZeRO the stages hold the real parameters and
    gradients (ZeRO-3's ``param.data`` is empty between uses): use ``detect_anomalies`` there."""
    groups = (("parameter", module.named_parameters()), ("buffer", module.named_buffers()),
              ("gradient", ((n, p.grad) for n, p in module.named_parameters())), ("value", [("loss", loss)]))
    for what, items in groups:
        for name, t in items:
            # a buffer may hold -inf on purpose (an attention mask): only nan counts there
            if t is not None and (kind := _kind(t)) and (what != "buffer" or "nan" in kind):
                return Finding(what, name, kind, tuple(t.shape))
    return None


@dataclass(frozen=True)
class SkippedStep:
    iteration: int
    loss_scale: float
    cause: str


class Anomalies:
    """Hooks naming the first inf/nan of a step: ``forward`` (first module output, forward order),
    ``backward`` (first gradient of a module output, backward order), ``param_grad`` (first parameter
    gradient). With an fp16 loss scaler, each skipped step is added to ``skipped`` with its cause, and
    the findings are cleared at every optimizer step; otherwise ``reset()`` clears them."""

    def __init__(self, target, verbose: bool = False):
        stage = getattr(target, "optimizer", None) if hasattr(target, "module") else None
        self.module = target.module if stage is not None else target
        self.verbose, self.skipped, self._handles = verbose, [], []
        self.reset()
        for name, mod in self.module.named_modules():
            # prepend: run before ZeRO-3's forward hook releases the parameters
            self._handles.append(mod.register_forward_hook(self._on_forward(name or type(mod).__name__), prepend=True))
        for name, p in self.module.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_hook(self._on_param_grad(name)))
        self._scaler = getattr(stage, "loss_scaler", None) if stage is not None else None
        if self._scaler is not None:
            self._scaler.update_scale = self._on_update(self._scaler.update_scale)  # shadows the method

    def reset(self) -> None:
        self.forward = self.backward = self.param_grad = None

    @property
    def first(self) -> Finding | None:
        return self.forward or self.backward or self.param_grad

    def _on_forward(self, name: str):
        def hook(mod, args, out):
            outs = _tensors(out)
            if self.forward is None and (bad := next((t for t in outs if _kind(t)), None)) is not None:
                own = [(f"{name}.{n}", p) for n, p in mod.named_parameters(recurse=False) if p.numel()]
                bad_param = next(((n, k) for n, p in own if (k := _kind(p.detach()))), None)
                if bad_param:
                    note = f"parameter {bad_param[0]} holds {bad_param[1]}"
                elif all(_kind(t) is None for t in _tensors(args)):
                    big = max(((n, float(p.detach().abs().max())) for n, p in own), key=lambda x: x[1], default=None)
                    note = "its inputs were finite: the first inf/nan is made here" + (
                        f" (largest |parameter|: {big[0]} = {big[1]:.3g})" if big else "")
                else:
                    note = (f"its input was already non-finite: the values went bad in code outside any submodule "
                            f"(in the forward of '{name.rpartition('.')[0] or 'the model'}' or above)")
                self.forward = Finding("forward output", name, _kind(bad), tuple(bad.shape), note)
            for t in outs:
                if t.requires_grad:
                    t.register_hook(self._on_output_grad(name))
        return hook

    def _on_output_grad(self, name: str):
        def hook(g):
            if self.backward is None and (kind := _kind(g)):
                self.backward = Finding("gradient w.r.t. the output", name, kind, tuple(g.shape))
        return hook

    def _on_param_grad(self, name: str):
        def hook(g):
            if self.param_grad is None and (kind := _kind(g)):
                self.param_grad = Finding("gradient", name, kind, tuple(g.shape))
        return hook

    def _on_update(self, update_scale):
        def hook(overflow: bool) -> None:
            if overflow:
                cause = str(self.first) if self.first else "no hooked tensor held inf/nan (the overflow is in the step)"
                self.skipped.append(SkippedStep(self._scaler.cur_iter, self._scaler.loss_scale, cause))
                if self.verbose:
                    print(f"[zero_ref] step skipped at iteration {self._scaler.cur_iter}: fp16 overflow at loss scale "
                          f"{self._scaler.loss_scale:g}; first inf/nan: {cause}")
            self.reset()
            update_scale(overflow)
        return hook

    def report(self) -> str:
        found = [f for f in (self.forward, self.backward, self.param_grad) if f is not None]
        return "\n".join(f"first non-finite {f}" for f in found) or "no inf/nan seen"

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._scaler is not None:
            del self._scaler.update_scale  # the class's method again
            self._scaler = None

    def __enter__(self) -> "Anomalies":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def detect_anomalies(target, verbose: bool = False) -> Anomalies:
    """Hooks on ``target`` (an Engine, or an nn.Module) that name the first tensor to hold inf/nan.

    Use as ``with detect_anomalies(engine) as a: ...`` (the hooks go away on exit) or keep the object and
    call ``remove()``. Each module's outputs are checked (a host sync per module: a debugging mode)."""
    return Anomalies(target, verbose)
