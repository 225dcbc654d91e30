"""Memory by category on one rank: measured vs the formula vs the simulator, and what to change on OOM.

``memory_report(engine_or_stage)`` counts the storage bytes of the stage's tensors by category
(``state_tensors``, ``zero_ref.measure``) and sets three predictions beside them: the chapter's
formula for Ψ trainable parameters (``zero_ref.memory.model_state_bytes``), the same recipe applied
to the stage's real flat layout (each bucket or unit padded to a multiple of the world size; ZeRO-3
also keeps frozen units' shards and persistent units whole), and the simulator's numbers if the
caller passes them (zero_ref never imports sim). Measured must equal the layout's prediction
byte for byte; the verdict names any category where it does not.

``explain_oom`` takes the other direction: from Ψ, world size, precision and activation bytes, how
much a device needs by category, which category dominates, and the first configuration in order of
cost that fits the budget (it reuses ``zero_ref.memory.plan_zero_stage`` and ``offload_placement``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from zero_ref.measure import unique_storage_bytes
from zero_ref.memory import CATEGORIES, model_state_bytes, offload_placement, plan_zero_stage, recipe


_SIM = {"param": "params", "grad": "grads", "optim": "optimizer", "activation": "activations",
        "zero3_gathered": "gathered params", "comm_bucket": "comm buckets"}  # sim's category names → ours


@dataclass
class MemoryReport:
    """One rank's model-state bytes: ``measured``, ``formula`` (the chapter's, for Ψ trainable
    parameters), ``expected`` (the same recipe on the stage's real flat layout: padding, ZeRO-3's
    persistent and frozen units) and ``simulated`` (sim's per-category numbers, if given)."""

    rank: int
    world_size: int
    stage: int
    precision: str
    num_params: int
    measured: dict
    formula: dict
    expected: dict
    terms: dict = field(default_factory=dict)  # why expected ≠ formula: {term: {category: bytes}}
    simulated: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def mismatches(self) -> list[str]:
        return [c for c in CATEGORIES if self.measured[c] != self.expected[c]]

    def table(self) -> str:
        cols = ["measured", "formula", "expected"] + (["simulated"] if self.simulated else [])
        rows = [f"{'category':<16}" + "".join(f"{c:>14}" for c in cols)]
        for cat in dict.fromkeys([*CATEGORIES, *self.measured, *self.simulated]):
            vals = [self.measured.get(cat), self.formula.get(cat), self.expected.get(cat), self.simulated.get(cat)]
            rows.append(f"{cat:<16}" + "".join(f"{'-' if v is None else f'{v:,.0f}':>14}" for v in vals[:len(cols)]))
        return "\n".join(rows)

    def verdict(self) -> str:
        bad = self.mismatches()
        if bad:
            return "MISMATCH: " + "; ".join(
                f"{c}: measured {self.measured[c]:,} B, expected {self.expected[c]:,.0f} B "
                f"({self.measured[c] - self.expected[c]:+,.0f} B)" for c in bad) + \
                ". This rank holds tensors the stage's recipe does not account for (or lacks some)."
        lines = ["OK: measured = expected in every category."]
        for c in CATEGORIES:
            if self.measured[c] != self.formula[c]:
                parts = " + ".join(f"{t} {v[c]:,.0f} B" for t, v in self.terms.items() if v.get(c))
                lines.append(f"{c}: measured - formula = {self.measured[c] - self.formula[c]:+,.0f} B = {parts}")
        return "\n".join(lines)

    def oom(self, device_bytes: float, **kw) -> "OomAdvice":
        """``explain_oom`` for this rank's model, stage, precision and world size."""
        return explain_oom(self.num_params, dp=self.world_size, zero_stage=self.stage, precision=self.precision,
                           device_bytes=device_bytes, **kw)

    def __str__(self) -> str:
        head = (f"rank {self.rank} of {self.world_size}, ZeRO-{self.stage}, {self.precision}, "
                f"Ψ = {self.num_params:,} trainable parameters")
        return "\n".join([head, self.table(), self.verdict(), *self.notes])


def _stage(target):
    stage = getattr(target, "optimizer", target)  # an Engine holds its stage as .optimizer
    if not hasattr(stage, "state_tensors") or not hasattr(stage, "buckets"):
        raise TypeError(f"memory_report needs a zero_ref Engine or stage, got {type(target).__name__}")
    return stage


def memory_report(target, *, simulated: Mapping | None = None, activations: int | None = None) -> MemoryReport:
    """Model-state bytes of this rank (``target``: an Engine or a ZeRO stage), measured vs formula.

    ``simulated``: a per-category mapping from the simulator for the same plan, e.g.
    ``sim.simulate(...).peak_memory[0]`` (its names — param, grad, optim, activation — are mapped).
    ``activations``: saved-activation bytes measured by the caller (``measure.saved_activation_bytes``),
    shown beside the simulator's; the verdict covers model states only.
    """
    stage = _stage(target)
    measured = {k: unique_storage_bytes(v) for k, v in stage.state_tensors().items()}
    if activations is not None:
        measured["activations"] = int(activations)
    r, n, s = recipe(stage.precision), stage.world_size, stage.stage
    psi = sum(b.layout.numel for b in stage.buckets)  # trainable elements (ZeRO-3's params are empty now)
    formula = model_state_bytes(psi, zero_stage=s, dp=n, precision=stage.precision).as_dict()
    expected = dict.fromkeys(CATEGORIES, 0)
    for b in stage.buckets:
        for buf in r.buffers:
            held = b.layout.shard_numel if s >= buf.sharded_from_stage else b.layout.padded_numel
            expected[buf.category] += buf.bytes_per_param * held
    terms = {}
    if s == 3:  # every unit's shard (frozen ones too), plus the whole of each persistent unit
        bp, trainable = r.bytes_per_param("params"), {id(b) for b in stage.buckets}
        terms["persistent units (whole)"] = {"params": bp * sum(u.size for u in stage.units if u.persistent)}
        terms["frozen units (shards)"] = {"params": bp * sum(u.layout.shard_numel for u in stage.units
                                                             if id(u) not in trainable)}
        expected["params"] += sum(t["params"] for t in terms.values())
    held = {c: expected[c] - sum(t.get(c, 0) for t in terms.values()) for c in CATEGORIES}
    terms = {"padding": {c: held[c] - formula[c] for c in CATEGORIES}, **terms}
    notes = ["note: offload is configured; the tiers are not itemised (zero_ref.memory.offload_placement has them)"
             ] if stage.offload is not None or getattr(stage, "param_offload", None) is not None else []
    sim = {_SIM.get(k, k): float(v) for k, v in (simulated or {}).items() if k != "total" and v}
    return MemoryReport(stage.rank, n, s, stage.precision, psi, measured, {c: formula[c] for c in CATEGORIES},
                        expected, terms, sim, notes)


@dataclass
class OomAdvice:
    """Bytes needed now by category, the budget, and configurations tried in order of cost."""

    needed: dict
    budget: float
    options: list  # (description, bytes per device, fits)

    @property
    def largest(self) -> str:
        return max(self.needed, key=self.needed.get)

    @property
    def fix(self) -> str | None:
        return next((d for d, _, fits in self.options if fits), None)

    def __str__(self) -> str:
        total, gib = sum(self.needed.values()), 2**30
        knob = {"optimizer": "ZeRO-1 partitions it; offload_optimizer moves it to the host",
                "grads": "ZeRO-2 partitions them", "params": "ZeRO-3 partitions them; offload_param moves them",
                "activations": "activation checkpointing (recompute) or a smaller micro-batch cuts them"}
        lines = [f"needs {total / gib:.2f} GiB, budget {self.budget / gib:.2f} GiB"
                 + (f": over by {(total - self.budget) / gib:.2f} GiB" if total > self.budget else ": fits"),
                 *(f"  {c:<12}{b / gib:>9.2f} GiB {b / total:6.1%}" for c, b in self.needed.items()),
                 f"largest: {self.largest} ({knob[self.largest]})"]
        lines += [f"  {'fits ' if fits else 'no   '}{b / gib:>9.2f} GiB  {d}" for d, b, fits in self.options]
        return "\n".join(lines + [f"fix: {self.fix}" if self.fix else "fix: none of these fits; add devices"])


_RECOMPUTE = ("none", "selective", "full")


def explain_oom(num_params: int, *, dp: int, device_bytes: float, zero_stage: int = 0, precision: str = "mixed",
                activations: float | Mapping = 0.0, recompute: str = "none") -> OomAdvice:
    """What fills a device and the cheapest change that fits ``device_bytes`` (zero_ref.memory's formulas).

    ``activations``: bytes per device, or a mapping recompute mode ('none' / 'selective' / 'full') →
    bytes (from ``memory.activation_bytes``); ``recompute`` is the current mode. Tried in order, the
    first that fits is the fix: ZeRO stages 0–2 (no extra traffic), then with more recompute (more
    compute), then ZeRO-3 (1.5× the traffic), then optimizer offload and parameter offload (PCIe).
    """
    acts = dict(activations) if isinstance(activations, Mapping) else {recompute: float(activations)}
    if recompute not in acts or any(m not in _RECOMPUTE for m in acts):
        raise ValueError(f"activations must map recompute modes {_RECOMPUTE} to bytes, including the current "
                         f"recompute={recompute!r}; got keys {sorted(acts)}")
    now = model_state_bytes(num_params, zero_stage=zero_stage, dp=dp, precision=precision).as_dict()
    needed = {**{c: now[c] for c in CATEGORIES}, "activations": acts[recompute]}
    modes = [m for m in _RECOMPUTE[_RECOMPUTE.index(recompute):] if m in acts]
    options = []
    for low in (True, False):  # stages 0-2 with each recompute mode first, then ZeRO-3 with each
        for m in modes:
            _, rows = plan_zero_stage(num_params, dp=dp, device_bytes=device_bytes, precision=precision,
                                      other_bytes=acts[m])
            row = next((r for r in rows if (r[0] < 3) == low and r[2]), rows[2 if low else 3])
            options.append((f"ZeRO-{row[0]}, recompute={m}", row[1].total + acts[m], row[2]))
    for off_param in ("none", "cpu"):
        gpu = offload_placement(num_params, zero_stage=3, dp=dp, precision=precision, offload_optimizer="cpu",
                                offload_param=off_param)["gpu"].total + acts[modes[-1]]
        options.append((f"ZeRO-3, offload_optimizer=cpu, offload_param={off_param}, recompute={modes[-1]}",
                        gpu, gpu <= device_bytes))
    return OomAdvice(needed, float(device_bytes), options)


