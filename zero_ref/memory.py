"""The memory model: bytes per device for model states, offload tiers (and their traffic) and activations.

Pure Python (no torch), so the simulator and the notebooks' sliders can use it anywhere.
Ψ is the number of parameters, N_d (``dp``) the data-parallel degree.

Model states follow the ZeRO paper (Rajbhandari et al., arXiv 1910.02054, §3 and Figure 1):
a precision *recipe* lists every per-parameter buffer, its bytes, and the ZeRO stage from
which it is partitioned over the data-parallel group:

    stage 1 (P_os)      partitions the optimizer states,
    stage 2 (P_os+g)    also the gradients,
    stage 3 (P_os+g+p)  also the parameters.

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (arXiv 2205.05198), §4: 16-bit activations and 1-byte dropout masks.
"""
from __future__ import annotations

import gettext
import math
from dataclasses import dataclass
from fractions import Fraction

GB = 10**9  # the ZeRO paper's GB
GiB = 2**30

CATEGORIES = ("params", "grads", "optimizer")


@dataclass(frozen=True)
class Buffer:
    """One per-parameter buffer of a training recipe."""

    name: str
    category: str  # one of CATEGORIES
    dtype: str
    bytes_per_param: int
    sharded_from_stage: int  # the ZeRO stage that first partitions it over data parallelism


@dataclass(frozen=True)
class Recipe:
    """A precision recipe: which buffers exist per parameter, in which dtype."""

    name: str
    description: str
    buffers: tuple[Buffer, ...]

    def bytes_per_param(self, category: str | None = None) -> int:
        return sum(b.bytes_per_param for b in self.buffers if category in (None, b.category))

    @property
    def K(self) -> int:
        """The ZeRO paper's K: optimizer-state bytes per parameter."""
        return self.bytes_per_param("optimizer")


def _adam(master: bool) -> tuple[Buffer, ...]:
    master_copy = (Buffer("fp32 master params", "optimizer", "fp32", 4, 1),) if master else ()
    return master_copy + (
        Buffer("Adam exp_avg (momentum)", "optimizer", "fp32", 4, 1),
        Buffer("Adam exp_avg_sq (variance)", "optimizer", "fp32", 4, 1),
    )


RECIPES: dict[str, Recipe] = {
    "fp32": Recipe(
        "fp32",
        "fp32 params and grads, Adam in fp32 (no master copy needed): 4+4+8 = 16 bytes, K = 8",
        (Buffer("fp32 params", "params", "fp32", 4, 3), Buffer("fp32 grads", "grads", "fp32", 4, 2))
        + _adam(master=False),
    ),
    "fp16": Recipe(
        "fp16",
        "fp16 params and grads, fp32 master weights and Adam states (the ZeRO paper): 2+2+12 = 16, K = 12",
        (Buffer("fp16 params", "params", "fp16", 2, 3), Buffer("fp16 grads", "grads", "fp16", 2, 2))
        + _adam(master=True),
    ),
    "bf16": Recipe(
        "bf16",
        "bf16 params and grads, fp32 master weights and Adam states: 2+2+12 = 16, K = 12",
        (Buffer("bf16 params", "params", "bf16", 2, 3), Buffer("bf16 grads", "grads", "bf16", 2, 2))
        + _adam(master=True),
    ),
    "bf16_fp32_grads": Recipe(
        "bf16_fp32_grads",
        "bf16 params, fp32 gradient accumulation buffers (as Megatron keeps them), fp32 master "
        "and Adam states: 2+4+12 = 18, K = 12",
        (Buffer("bf16 params", "params", "bf16", 2, 3), Buffer("fp32 main grads", "grads", "fp32", 4, 2))
        + _adam(master=True),
    ),
}
ALIASES = {"mixed": "fp16", "fp16_mixed": "fp16", "bf16_mixed": "bf16"}


def recipe(name: str) -> Recipe:
    """Look up a precision recipe by name (``"mixed"`` is the ZeRO paper's fp16 recipe)."""
    key = ALIASES.get(name, name)
    if key not in RECIPES:
        known = ", ".join(sorted(RECIPES) + sorted(ALIASES))
        raise ValueError(f"precision={name!r} is not a known recipe; choose one of: {known}")
    return RECIPES[key]


def recipe_table() -> str:
    """A plain-text table of every recipe's buffers (chapters print it), in the reader's language."""
    def _(message: str) -> str:  # gettext: a Chinese-edition kernel binds the catalog (course/i18n.py)
        return gettext.dgettext("zero_lab", message)

    lines = [f"{_('recipe'):<16}{_('buffer'):<30}{_('dtype'):<6}{_('B/param'):>8}  {_('partitioned from')}"]
    for r in RECIPES.values():
        for b in r.buffers:
            stage = _("stage {n}").format(n=b.sharded_from_stage)
            lines.append(f"{r.name:<16}{_(b.name):<30}{b.dtype:<6}{b.bytes_per_param:>8}  {stage}")
        lines.append(f"{r.name:<16}{_('total'):<30}{'':<6}{r.bytes_per_param():>8}  (K = {r.K})")
    return "\n".join(lines)


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes of model states held by one device, by category."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer, "total": self.total}

    def in_units(self, unit: int = GB, ndigits: int = 2) -> dict[str, float]:
        return {k: round(v / unit, ndigits) for k, v in self.as_dict().items()}


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_stage(zero_stage) -> None:
    if zero_stage not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")


def shard_numel(numel: int, dp: int, *, padded: bool = True) -> float:
    """Elements of one rank's partition: ceil(numel/dp) when the flat buffer is padded to split evenly."""
    return math.ceil(numel / dp) if padded else numel / dp


def model_state_bytes(
    num_params: int,
    *,
    zero_stage: int,
    dp: int,
    precision: str = "mixed",
    tp: int = 1,
    pp: int = 1,
    padded: bool = False,
) -> ModelStateBytes:
    """Per-device bytes of params / grads / optimizer states under ZeRO ``zero_stage`` over ``dp`` ranks.

    With tensor (``tp``) and pipeline (``pp``) parallelism each device first holds Ψ/(tp·pp) of the
    model (an even split; embeddings and replicated LayerNorms are ignored), then ZeRO partitions
    that over the data-parallel group. ``padded=True`` rounds each partition up to whole elements,
    as a flat buffer padded to a multiple of ``dp`` does.

    >>> m = model_state_bytes(7_500_000_000, zero_stage=1, dp=64)   # ZeRO paper, Figure 1
    >>> round(m.total / GB, 1)
    31.4
    """
    _check_positive_int("num_params", num_params)
    _check_stage(zero_stage)
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        _check_positive_int(name, value)
    r = recipe(precision)
    local = num_params / (tp * pp)
    if padded:
        local = math.ceil(local)
    by_cat = dict.fromkeys(CATEGORIES, 0.0)
    for b in r.buffers:
        n = shard_numel(local, dp, padded=padded) if zero_stage >= b.sharded_from_stage else local
        by_cat[b.category] += n * b.bytes_per_param
    return ModelStateBytes(**by_cat)


# ---------------------------------------------------------------- offload tiers

TIERS = ("gpu", "cpu", "nvme")


def offload_placement(
    num_params: int,
    *,
    zero_stage: int,
    dp: int,
    precision: str = "mixed",
    offload_optimizer: str = "none",
    offload_param: str = "none",
) -> dict[str, ModelStateBytes]:
    """Bytes per rank on each tier (gpu / cpu / nvme) with DeepSpeed's offload options.

    DeepSpeed's rules: ``offload_optimizer`` needs ZeRO stage ≥ 1 and moves the rank's partition of
    the fp32 master weights and Adam states *and* an fp32 copy of its gradient partition (the CPU
    Adam steps on it) to the target; NVMe needs stage 3. ``offload_param`` needs stage 3 and moves
    the rank's 16-bit parameter partition. What stays on the GPU: the rest. Transient buffers
    (buckets, gathered ZeRO-3 layers, pinned staging) are not model states and are not counted here.
    """
    for key, value in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
        if value not in ("none", "cpu", "nvme"):
            raise ValueError(f"{key} device must be 'none', 'cpu' or 'nvme', got {value!r}")
    if offload_optimizer != "none" and zero_stage == 0:
        raise ValueError("offload_optimizer needs zero_stage >= 1 (ZeRO-Offload partitions the optimizer first)")
    if offload_optimizer == "nvme" and zero_stage != 3:
        raise ValueError("offload_optimizer device 'nvme' needs zero_stage=3 (ZeRO-Infinity)")
    if offload_param != "none" and zero_stage != 3:
        raise ValueError("offload_param needs zero_stage=3: only ZeRO-3 partitions the parameters")
    states = model_state_bytes(num_params, zero_stage=zero_stage, dp=dp, precision=precision)
    tiers = {t: dict.fromkeys(CATEGORIES, 0.0) for t in TIERS}
    tiers["gpu"].update(states.as_dict())
    del tiers["gpu"]["total"]
    if offload_optimizer != "none":
        tiers[offload_optimizer]["optimizer"] += tiers["gpu"]["optimizer"]
        tiers["gpu"]["optimizer"] = 0.0
        # The 16-bit gradients leave the GPU as their partition completes; the CPU holds them in fp32.
        tiers[offload_optimizer]["grads"] += 4 * shard_numel(num_params, dp, padded=False)
        tiers["gpu"]["grads"] = 0.0
    if offload_param != "none":
        tiers[offload_param]["params"] += tiers["gpu"]["params"]
        tiers["gpu"]["params"] = 0.0
    return {t: ModelStateBytes(**v) for t, v in tiers.items()}


# ---------------------------------------------------------------- offload traffic (chapters 6 and 7)

_VALUE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def pcie_bytes_per_step(num_params: int, *, zero_stage: int, dp: int, precision: str = "bf16",
                        gradient_accumulation_steps: int = 1) -> dict[str, int]:
    """Bytes one rank moves over the host link per optimizer step with ``offload_optimizer`` cpu.

    Device → host: the rank's reduced 16-bit gradient shard, ⌈Ψ/N⌉ elements — once per step in
    stage 1 (it accumulates on the device), on every micro-step in stages 2 and 3. Host → device:
    the updated 16-bit partition, once per step. ``num_params`` may be a padded count."""
    if zero_stage not in (1, 2, 3):
        raise ValueError(f"offload_optimizer needs zero_stage 1, 2 or 3, got {zero_stage!r}")
    shard = math.ceil(num_params / dp) * _VALUE_BYTES[precision]
    d2h = shard * (1 if zero_stage == 1 else gradient_accumulation_steps)
    return {"d2h": d2h, "h2d": shard, "total": d2h + shard}


def nvme_bytes_per_step(num_params: int, *, dp: int, precision: str = "bf16", offload_param: bool = False,
                        gathers_per_step: int = 2) -> dict[str, int]:
    """Bytes one rank reads from and writes to NVMe per optimizer step (ZeRO-Infinity, stage 3).

    The step reads and writes every sub-group's fp32 master, exp_avg and exp_avg_sq: 12 bytes per
    element of the partition each way. With parameters on NVMe too, each gather of a unit reads its
    16-bit partition (``gathers_per_step``: forward + backward = 2 per micro-step) and the step
    writes the updated partition once."""
    shard = math.ceil(num_params / dp)
    read = write = 12 * shard
    if offload_param:
        read += gathers_per_step * _VALUE_BYTES[precision] * shard
        write += _VALUE_BYTES[precision] * shard
    return {"read": read, "write": write}


# ---------------------------------------------------------------- DeepSpeed's estimators
# Same names, arguments and arithmetic as deepspeed/runtime/zero/{stage_1_and_2,stage3}.py (0.19.x),
# so a DeepSpeed user's numbers carry over. They include DeepSpeed's implementation details
# (e.g. ZeRO-2 keeps an fp32 gradient partition: 2Ψ + 18Ψ/N) and a 1.5× CPU buffer factor.


def estimate_zero2_model_states_mem_needs(
    total_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=True, additional_buffer_factor=1.5
):
    """Return (cpu_bytes, gpu_bytes) per DeepSpeed's ZeRO-2 estimator."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        # 2 = 16-bit params; 18 = 16-bit grads + fp32 grads + fp32 params + two fp32 Adam moments.
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def estimate_zero3_model_states_mem_needs(
    total_params,
    largest_layer_params,
    num_gpus_per_node=1,
    num_nodes=1,
    cpu_offload=True,
    cpu_offload_params=True,
    zero_init=True,
    additional_buffer_factor=1.5,
):
    """Return (cpu_bytes, gpu_bytes, largest_layer_bytes) per DeepSpeed's ZeRO-3 estimator."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params  # one gathered layer: 16-bit params + grads
    # The products are written in DeepSpeed's order: float rounding depends on it.
    if cpu_offload and cpu_offload_params:
        gpu_mem = largest_layer_memory
        if zero_init:
            cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
        else:
            cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
    elif cpu_offload:
        gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
        if zero_init:
            cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
        else:
            cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        held = largest_layer_params if zero_init else total_params
        cpu_mem = held * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


# ---------------------------------------------------------------- parameter counts


def transformer_param_count(
    num_layers: int,
    hidden: int,
    vocab: int,
    *,
    seq_len: int | None = None,
    ffn_hidden: int | None = None,
    bias: bool = True,
    tied: bool = True,
    gated: bool = False,
    norm: str = "layernorm",
    heads: int | None = None,
    kv_heads: int | None = None,
) -> int:
    """Parameters of a decoder-only transformer: 12h² + 13h per layer for GPT-2 (4h MLP, biases).

    Per layer: attention 4h² (+4h bias), MLP 2·h·f (+f+h bias) — or 3·h·f for a gated (SwiGLU)
    MLP as in LLaMA — and two norms (LayerNorm 2h each, RMSNorm h each). Plus the token embedding
    V·h, learned positions s·h (if ``seq_len``), the final norm, and an output head V·h unless it
    is tied to the embedding. With grouped-query attention (``kv_heads`` < ``heads``) the k and v
    projections map h to kv_heads · h/heads each: attention 2h² + 2h²·kv_heads/heads.

    >>> transformer_param_count(80, 8192, 32000, ffn_hidden=22016, bias=False, tied=False,
    ...                         gated=True, norm="rmsnorm")   # LLaMA-65B
    65285660672
    """
    for name, value in (("num_layers", num_layers), ("hidden", hidden), ("vocab", vocab)):
        _check_positive_int(name, value)
    if norm not in ("layernorm", "rmsnorm"):
        raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {norm!r}")
    h, f = hidden, ffn_hidden or 4 * hidden
    kv = h if kv_heads is None else _kv_width(h, heads, kv_heads)  # width of the k (and of the v) projection
    norm_params = 2 * h if norm == "layernorm" else h
    mlp = (3 if gated else 2) * h * f + ((2 * f if gated else f) + h if bias else 0)
    per_layer = 2 * h * h + 2 * h * kv + (2 * h + 2 * kv if bias else 0) + mlp + 2 * norm_params
    total = num_layers * per_layer + vocab * h + norm_params + (seq_len or 0) * h
    return total + (0 if tied else vocab * h)


def _kv_width(hidden: int, heads, kv_heads) -> int:
    """kv_heads × head dimension, after checking that the heads group evenly."""
    if heads is None:
        raise ValueError("kv_heads needs heads (the head dimension is hidden / heads)")
    _check_positive_int("heads", heads)
    _check_positive_int("kv_heads", kv_heads)
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"heads={heads} must divide hidden={hidden} and be a multiple of kv_heads={kv_heads}")
    return kv_heads * (hidden // heads)


# ---------------------------------------------------------------- activations


def _exact(x: Fraction) -> int | float:
    return int(x) if x.denominator == 1 else float(x)


def activation_bytes_per_layer(
    seq: int, batch: int, hidden: int, heads: int, *, tp: int = 1, sp: bool = False, recompute: str = "none"
) -> int | float:
    """Activation bytes one transformer layer keeps for backward (Korthikanti et al., Table 2).

    s·b·h·(34 + 5as/h) without parallelism; with tensor parallelism t the attention and MLP
    interiors split but LayerNorm/dropout inputs do not: sbh(10 + 24/t + 5as/(ht)); sequence
    parallelism also splits those: sbh(34 + 5as/h)/t. ``recompute="selective"`` recomputes the
    attention core (drops the 5as/h term); ``"full"`` keeps only the layer input, 2sbh (/t with SP).
    """
    for name, value in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads), ("tp", tp)):
        _check_positive_int(name, value)
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    s, b, h, a, t = seq, batch, hidden, heads, Fraction(tp)
    sbh = Fraction(s * b * h)
    if recompute == "full":
        return _exact(2 * sbh / (t if sp else 1))
    attention_core = Fraction(5 * a * s * s * b) if recompute == "none" else Fraction(0)
    if sp:
        return _exact((34 * sbh + attention_core) / t)
    return _exact(10 * sbh + 24 * sbh / t + attention_core / t)


def activation_bytes(num_layers: int, seq: int, batch: int, hidden: int, heads: int, **kw) -> int | float:
    """Activation bytes of ``num_layers`` transformer layers (embedding and head not included)."""
    _check_positive_int("num_layers", num_layers)
    return num_layers * activation_bytes_per_layer(seq, batch, hidden, heads, **kw)


ATTENTION = ("eager", "flash")
MLPS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class ActivationTerms:
    """The bytes one layer keeps for backward, tensor by tensor (``terms``: name → bytes)."""

    terms: dict

    @property
    def total(self) -> int | float:
        return _exact(sum(Fraction(v) for v in self.terms.values()))

    def table(self, unit: int = 1) -> str:
        width = max(map(len, self.terms))
        rows = [f"{name:<{width}}  {v / unit:>14,.6g}" for name, v in self.terms.items()]
        return "\n".join(rows + [f"{'total':<{width}}  {self.total / unit:>14,.6g}"])


def activation_terms(
    seq: int, batch: int, hidden: int, heads: int, *, kv_heads: int | None = None, ffn: int | None = None,
    mlp: str = "gelu", norm: str = "layernorm", attention: str = "eager", dropout: bool = True,
    tp: int = 1, sp: bool = False, recompute: str = "none", stat_bytes: int = 4,
) -> ActivationTerms:
    """The tensors one transformer layer keeps for backward, by name, in bytes (16-bit activations).

    Korthikanti et al.'s count (arXiv 2205.05198, §4.1) taken term by term and opened up for the
    blocks trained today. x is an s·b·h activation (2sbh bytes), f the MLP width (``ffn``, 4h by
    default), a the heads and g = ``kv_heads`` the key/value heads (d = h/a each):

        norms           each of the two keeps its input, 2sbh, and per-token statistics: mean and
                        rstd for LayerNorm, rstd alone for RMSNorm (``stat_bytes`` each: fp32 in the
                        CUDA kernels; torch's CPU LayerNorm keeps them in the input dtype; 0
                        leaves them out, as Korthikanti does)
        attention       the QKV projection's input 2sbh; Q 2sbh; K and V 2·2sbd·g
                        eager: K and V expanded to all a heads (4sbh), softmax output 2as²b,
                               with dropout its 1-byte mask as²b and its output 2as²b
                        flash: no s×s tensor; the softmax statistics instead, one fp32 log-sum-exp
                               per head and token, 4asb (its dropout keeps an RNG seed, not a mask)
                        the output projection's input 2sbh (flash's saved output is this tensor)
        MLP             its input 2sbh; GeLU: fc1's output (GeLU's input) 2sbf and fc2's input
                        2sbf; SwiGLU (fused, as Megatron's bias_swiglu keeps it): the gate and up
                        outputs 4sbf and the down projection's input 2sbf
        dropout         a 1-byte mask after attention and after the MLP, sbh each

    With ``dropout``, Korthikanti's GPT block (eager, GeLU, LayerNorm, g = a) is
    34sbh + 5as²b plus the norm statistics (``activation_bytes_per_layer``).

    Tensor parallelism (``tp`` = t) splits the heads (g must divide by t, as Megatron's
    ``divide(num_query_groups, tp)`` asserts) and the MLP width; the norms, their inputs, the QKV
    and MLP inputs and the dropout masks stay whole unless sequence parallelism (``sp``) splits
    them over the sequence. ``recompute``: 'selective' recomputes the attention core (the softmax
    terms go; Q and the unexpanded K, V stay as its inputs), 'full' keeps only the layer input.
    """
    for name, value in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads), ("tp", tp)):
        _check_positive_int(name, value)
    if stat_bytes != 0:  # 0: leave the statistics out, as Korthikanti does
        _check_positive_int("stat_bytes", stat_bytes)
    for name, value, choices in (("mlp", mlp, MLPS), ("norm", norm, NORMS), ("attention", attention, ATTENTION),
                                 ("recompute", recompute, ("none", "selective", "full"))):
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    g = heads if kv_heads is None else kv_heads
    kv = _kv_width(hidden, heads, g)
    if ffn is not None:
        _check_positive_int("ffn", ffn)
    if heads % tp or g % tp:
        raise ValueError(f"tp={tp} must divide heads={heads} and kv_heads={g} (Megatron splits whole "
                         "heads and key/value groups)")
    s, b, h, a, f = seq, batch, hidden, heads, ffn or 4 * hidden
    t, r = Fraction(tp), Fraction(tp if sp else 1)  # t splits the interiors; r the rest (with SP)
    sb, sbh = s * b, s * b * h
    if recompute == "full":
        return ActivationTerms({"layer input": _exact(2 * sbh / r)})
    stats = (2 if norm == "layernorm" else 1) * stat_bytes * sb
    terms = {"norm inputs": 2 * 2 * sbh / r, **({"norm statistics": 2 * stats / r} if stats else {}),
             "QKV input": 2 * sbh / r, "Q": 2 * sbh / t}
    expand = attention == "eager" and recompute == "none"
    terms["K, V" + (" (expanded to all heads)" if expand and g != a else "")] = 2 * 2 * sb * (h if expand else kv) / t
    if recompute == "none":
        if attention == "eager":
            terms["softmax output"] = 2 * a * s * sb / t
            if dropout:
                terms["attention dropout mask"] = a * s * sb / t
                terms["attention dropout output"] = 2 * a * s * sb / t
        else:
            terms["softmax statistics (log-sum-exp)"] = 4 * a * sb / t
    terms["out-projection input"] = 2 * sbh / t
    terms["MLP input"] = 2 * sbh / r
    if mlp == "gelu":
        terms["GeLU input"] = 2 * sb * f / t
        terms["fc2 input"] = 2 * sb * f / t
    else:
        terms["gate and up outputs"] = 4 * sb * f / t
        terms["down-projection input"] = 2 * sb * f / t
    if dropout:
        terms["hidden dropout masks"] = 2 * sbh / r
    return ActivationTerms({k: _exact(Fraction(v)) for k, v in terms.items()})


# ---------------------------------------------------------------- "do I need ZeRO?"


def plan_zero_stage(
    num_params: int,
    *,
    dp: int,
    device_bytes: float,
    precision: str = "mixed",
    other_bytes: float = 0.0,
    tp: int = 1,
    pp: int = 1,
) -> tuple[int | None, list[tuple[int, ModelStateBytes, bool]]]:
    """The lowest ZeRO stage whose model states plus ``other_bytes`` (activations, buffers) fit.

    Lower stages communicate no more, so the lowest stage that fits is the first choice. In
    DeepSpeed 0.19.8 (zero_ref.volume.dp_bytes_per_step) a rank sends per step 2Ψ(n−1)/n at stage
    0 (an all-reduce), 3Ψ(n−1)/n at stages 1–2 (an all-reduce of each gradient bucket, then an
    all-gather of the parameters: runtime/zero/stage_1_and_2.py, ``average_tensor`` →
    ``allreduce_and_scatter``) and at stage 3, where stage 2's all-reduce and stage 3's gathers
    and reduce-scatter repeat every micro-step of gradient accumulation. The ZeRO paper counts
    2Ψ for stages 0–2 (a reduce-scatter instead of the all-reduce) and 3Ψ for stage 3.
    Returns (stage or None, [(stage, bytes, fits), ...]).
    """
    rows = []
    for stage in range(4):
        m = model_state_bytes(num_params, zero_stage=stage, dp=dp, precision=precision, tp=tp, pp=pp)
        rows.append((stage, m, m.total + other_bytes <= device_bytes))
    best = next((stage for stage, _, fits in rows if fits), None)
    return best, rows
