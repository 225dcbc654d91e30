"""Model and hardware FLOPs utilization (MFU, HFU): how much of the devices' peak a step puts to use.

    MFU = model FLOPs of a step / (step time × devices × peak FLOP/s per device)

Model FLOPs count what training the model needs, by the usual rule: a weight multiplies each
token once in the forward (2 FLOPs: multiply and add) and twice in the backward (for the input's
gradient and for its own), so a step over T tokens costs **6ΨT** (Kaplan et al. 2020; the MFU of
Chowdhery et al. 2022). Hardware FLOPs count what the devices run: with full activation
recomputation the forward runs twice, **8ΨT**, and HFU divides those. Recomputation makes a step
slower without raising MFU; it raises HFU.

6ΨT is a rule of thumb. It leaves out the attention scores (12·s·h FLOPs per token and layer,
forward and backward) and counts the embedding tables in Ψ although a lookup multiplies nothing.
``sim.cost.flops.model_flops_per_step`` counts layer by layer (GEMMs, the scores, the output head), and
``sim.calibration.published.megatron_flops`` is the Megatron papers' formula.
"""
from __future__ import annotations

RECOMPUTE_FACTOR = {"none": 6, "full": 8}


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def model_flops(params: float, tokens: float) -> float:
    """6ΨT: forward 2ΨT + backward 4ΨT."""
    _positive("params", params)
    _positive("tokens", tokens)
    return 6 * params * tokens


def hardware_flops(params: float, tokens: float, recompute: str = "none") -> float:
    """FLOPs the devices run: 6ΨT, or 8ΨT with full recomputation (the forward runs twice)."""
    if recompute not in RECOMPUTE_FACTOR:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_FACTOR)}, got {recompute!r}")
    return model_flops(params, tokens) / 6 * RECOMPUTE_FACTOR[recompute]


def _utilization(flops: float, step_time: float, devices: int, peak_flops: float) -> float:
    for name, v in (("step_time", step_time), ("devices", devices), ("peak_flops", peak_flops)):
        _positive(name, v)
    return flops / (step_time * devices * peak_flops)


def mfu(step_time: float, params: float, tokens: float, devices: int, peak_flops: float) -> float:
    """Model FLOPs utilization of a step of ``tokens`` tokens that took ``step_time`` seconds on ``devices``."""
    return _utilization(model_flops(params, tokens), step_time, devices, peak_flops)


def hfu(step_time: float, params: float, tokens: float, devices: int, peak_flops: float,
        recompute: str = "none") -> float:
    """Hardware FLOPs utilization: as ``mfu``, with the recomputed forward counted."""
    return _utilization(hardware_flops(params, tokens, recompute), step_time, devices, peak_flops)
