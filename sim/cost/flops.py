"""FLOPs and HBM bytes of a transformer's layers: what a step computes.

Compute, a roofline summed over a layer's kernels: t = FLOPs / (peak × efficiency) for the GEMMs
plus bytes / (HBM bandwidth × hbm_efficiency) for the memory-bound element-wise kernels (LayerNorm,
dropout, GeLU, softmax, residual adds), which barely compute but move every activation
(``layer_elementwise_bytes`` counts them). A transformer layer's forward on b sequences of s
tokens costs 2·b·s·(4h² + k·h·f) + 4·b·s²·h FLOPs (k = 2 MLP matrices, 3 if gated), which is
24bsh² + 4bs²h for the GPT MLP f = 4h; backward costs twice the forward; full recomputation adds
a forward, selective recomputation the attention core 4bs²h (and its softmax and dropout). The
element-wise share of a layer's time falls as 1/h and as h/(a·s) (the attention scores): this is
what makes a small model's compute less efficient than a large one's at the same GEMM efficiency.
"""
from __future__ import annotations


def layer_forward_flops(model, batch: int) -> float:
    """Forward FLOPs of one transformer layer on ``batch`` sequences: 2bs(2h² + 2h·h_kv + k·h·f) + 4bs²h.

    h_kv = kv_heads × head dimension is the k and v projections' width (h for multi-head
    attention, which gives 2bs(4h² + k·h·f)); the attention core 4bs²h is the same with grouped
    keys and values (every query head still attends over all s positions)."""
    b, s, h, f = batch, model.seq, model.hidden, model.ffn_hidden
    kv = getattr(model, "kv_width", h)
    return 2 * b * s * (2 * h * h + 2 * h * kv + (3 if model.gated else 2) * h * f) + 4 * b * s * s * h


def attention_core_flops(model, batch: int) -> float:
    """Forward FLOPs of QKᵀ and attention × V in one layer: 4bs²h (what selective recompute redoes)."""
    return 4 * batch * model.seq * model.seq * model.hidden


def layer_backward_flops(model, batch: int, recompute: str = "none", attention: str = "eager") -> float:
    """Backward FLOPs of one layer: twice the forward, plus what it recomputes.

    ``recompute`` 'full' adds a forward, 'selective' the attention core (4bs²h). FlashAttention's
    backward (``attention`` 'flash') recomputes the scores QKᵀ from Q, K and the kept log-sum-exp:
    2bs²h more, half the attention core, in every mode but 'full' (which already reruns it) and
    'selective' (which reruns the core's forward, scores included)."""
    fwd = layer_forward_flops(model, batch)
    core = attention_core_flops(model, batch)
    extra = {"none": core / 2 if attention == "flash" else 0.0, "selective": core, "full": fwd}[recompute]
    return 2 * fwd + extra


CAUSAL = 0.5  # share of the s² score blocks a causal FlashAttention kernel computes (it skips the masked ones)


def layer_flops(model, batch: int, recompute: str = "none", attention: str = "eager",
                recompute_gemms: float = 0.0) -> dict:
    """{'forward', 'backward'}: (GEMM FLOPs, FlashAttention FLOPs) of one layer, as the GPU runs them.

    'eager' attention is all GEMMs (``layer_forward_flops``, ``layer_backward_flops``). 'flash'
    takes the attention core out of the GEMMs and counts what FlashAttention's causal kernels
    execute: ``CAUSAL`` × 4bs²h forward and 2.5 × that backward (QKᵀ recomputed, then dV, dP, dQ,
    dK: five s² products against the forward's two); full recomputation runs the forward kernel
    again (3.5 ×); selective recomputation has nothing left to redo (the kernel keeps no scores).
    Those kernels reach their own share of peak (``Costs.attention_efficiency``), and model-FLOPs
    counts (``model_flops_per_step``, MFU) keep the unmasked 4bs²h the papers divide by.
    ``recompute_gemms``: the share of the forward's projection GEMMs the backward runs again besides
    (per-op selective checkpointing: ``op_sac_share``)."""
    fwd, bwd = layer_forward_flops(model, batch), layer_backward_flops(model, batch, recompute, attention)
    core = attention_core_flops(model, batch)
    extra = recompute_gemms * (fwd - core)
    if attention != "flash":
        return {"forward": (fwd, 0.0), "backward": (bwd + extra, 0.0)}
    gemm = fwd - core
    return {"forward": (gemm, CAUSAL * core),
            "backward": ((3 if recompute == "full" else 2) * gemm + extra,
                         CAUSAL * core * (3.5 if recompute == "full" else 2.5))}


def op_sac_share(model) -> float:
    """Share of a layer's projection GEMMs torchtitan's per-op selective checkpointing recomputes: it
    saves every other matmul's output (torchtitan/parallelisms/parallelize_llama.py, ``_custom_policy``:
    the 2nd, 4th and 6th of q, k, v, o, w1, w3, w2 are recomputed: k, o and the gated MLP's w3)."""
    h, kv, f = model.hidden, getattr(model, "kv_width", model.hidden), model.ffn_hidden
    mats = [h * h, h * kv, h * kv, h * h] + ([h * f, h * f, h * f] if model.gated else [h * f, h * f])
    return sum(mats[1::2]) / sum(mats)


def layer_elementwise_bytes(model, batch: int, *, tp: int = 1, sp: bool = False, width: int = 1,
                            attention: str = "eager") -> dict:
    """HBM bytes one layer's memory-bound kernels move on one tensor-parallel rank, per pass.

    Counted tensor by tensor for Megatron's fused kernels (a tensor read or written once each),
    with x an s·b·h activation (split over TP only with sequence parallelism ``sp``), i the
    s·b·f MLP intermediate (two for a gated MLP) and A the a·s²·b attention scores (both split
    over TP), 16-bit (× ``width``), plus 1-byte dropout masks m:

        forward   2 LayerNorms 4x, 2 bias-dropout-adds 6x + 2m_x, bias-GeLU 2i,
                  scale-mask-softmax 2A, attention dropout 2A + m_A, score GEMMs 2A
        backward  2 bias-dropout-adds 6x + 2m_x (with the bias gradients), 2 LayerNorms 12x (with
                  the residual-gradient adds), bias-GeLU 4i, attention dropout 2A + m_A, softmax 3A,
                  score GEMMs 4A
        attention_core  what selective recomputation re-runs: QKᵀ, softmax, dropout, 5A + m_A

    The score GEMMs (QKᵀ and scores × V, head dimension 128) are memory-bound on the roofline
    (≈ 110 FLOP/byte against an A100's ≈ 190), so the scores they write and read are counted here
    as well as their FLOPs being timed (a sum where the roofline takes a max: slightly
    pessimistic). Other GEMM operands are not counted. A model without dropout has no masks
    (m_x, m_A) and no attention dropout (2A each way). ``attention`` 'flash' keeps the scores in
    on-chip memory: no A term at all. Returns {'forward', 'backward', 'attention_core'};
    ``Costs.elementwise_traffic`` scales them.
    """
    s, b, h, a, t = model.seq, batch, model.hidden, model.heads, tp
    e = 2 * width                                   # bytes per activation element
    x_el = s * b * h / (t if sp else 1)             # LayerNorm / dropout / residual tensors
    i_el = s * b * model.ffn_hidden * (2 if model.gated else 1) / t
    a_el = 0.0 if attention == "flash" else a * s * s * b / t
    x, i, A = e * x_el, e * i_el, e * a_el
    drop = getattr(model, "dropout", True)
    mx, mA, dA = (2 * x_el, a_el, 2 * A) if drop else (0.0, 0.0, 0.0)  # masks, attention dropout
    return {"forward": 10 * x + mx + 2 * i + 4 * A + dA + mA,
            "backward": 18 * x + mx + 4 * i + 7 * A + dA + mA,
            "attention_core": 3 * A + dA + mA}


def head_forward_flops(model, batch: int) -> float:
    """Forward FLOPs of the output projection to the vocabulary: 2bshV."""
    return 2 * batch * model.seq * model.hidden * model.vocab


def model_flops_per_step(model, global_batch: int, *, head: bool = True) -> float:
    """Model FLOPs of one step (forward + backward = 3 × forward; recomputation not counted)."""
    fwd = model.layers * layer_forward_flops(model, 1) + (head_forward_flops(model, 1) if head else 0)
    return 3 * global_batch * fwd
