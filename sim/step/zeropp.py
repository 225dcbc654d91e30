"""ZeRO++ on DeepSpeed's ZeRO-3 (Wang et al. 2023): the collectives, kernel bytes and memory of qwZ, hpZ, qgZ.

With n = dp·cp ranks, g = ``Plan.hpz`` (hpZ's sub-group, consecutive ranks: a node) and M = n/g:

- qwZ: every ZeRO-3 all-gather of P parameters moves, per rank's shard of s = P/n' (n' the gathering
  group) int8 elements and one fp32 scale per block, DeepSpeed's block count
  (zero_ref.stages.zero3.block_quant.quantized_bytes): n'·(s + 4·blocks(s)) bytes instead of 2P
  (DeepSpeed 0.19.8: runtime/zero/partition_parameters.py, ``all_gather_coalesced`` →
  ``_all_gather_coalesced`` / ``_all_gather_sequential`` with ``quantize``, ``CUDAQuantizer.quantize``).
  Kernels: quantizing the own shard reads 2 (the 16-bit parameter) and writes 1 byte per element;
  dequantizing the full buffer reads 1 and writes 2 per element (the fp32 scales are not counted).
- hpZ: a unit's first gather of the step spans the n ranks (the primary shard) and leaves a secondary
  shard of 2Ψ/g bytes per rank; every later gather (backward's, the next micro-batches' forward) runs
  over the g ranks of the sub-group, axis 'dp_hpz' (partition_parameters.py: ``_partition_param_sec``
  and ``all_gather_coalesced``'s ``use_secondary_tensor``; the group from utils/groups.py
  ``_create_zero_param_parallel_group``, consecutive ranks). The secondary copy is dropped at the step
  (runtime/zero/stage3.py ``DeepSpeedZeroOptimizer_Stage3.invalidate_secondary_tensor``).
- qgZ: each gradient bucket of P elements is reduced by two int4 all-to-alls (runtime/comm/
  coalesced_collectives.py ``all_to_all_quant_reduce``, called by runtime/zero/stage3.py
  ``DeepSpeedZeroOptimizer_Stage3.__avg_scatter_grads``): inside the sub-group ('dp_hpz', g ranks) the
  whole bucket, g rows of M·s int4 elements; then, M > 1, across the sub-groups ('dp_hpz_across': the
  ranks of equal local index) M rows of s, the partial sums of 1/g of it. Blocks of
  zero_ref's qgZ block (``quantized_reduce.BLOCK``), one fp32 scale each. Kernels per element of the
  bucket (gradient of ``grad_bytes``): quantize reads grad_bytes and writes 0.5; step 1 reads the 0.5
  received and writes 4/g (fp32 sums of its 1/g), requantizes them (reads 4/g, writes 0.5/g); step 2
  reads 0.5/g and writes 4/n.

Differences from DeepSpeed: its qgZ node is ``accelerator.device_count()`` ranks and with one node it
reduce-scatters unquantized; here (as zero_ref) the node is the hpZ sub-group, all n ranks when hpZ is
off (step 1 only). DeepSpeed quantizes qgZ's 2-D gradients a row per block; here fixed blocks.
"""
from __future__ import annotations

from sim.cost.work import Collective


def quantized_bytes(*args, **kw) -> int:
    """zero_ref's own count (block_quant.quantized_bytes), imported on use: importing sim loads no torch."""
    from zero_ref.stages.zero3.block_quant import quantized_bytes as count
    return count(*args, **kw)


def _grad_block() -> int:
    from zero_ref.stages.zero3.quantized_reduce import BLOCK
    return BLOCK


def _elements(x: float) -> int:
    return max(1, round(x))


def gather_bytes(plan, params: float, param_bytes: int, n: int) -> float:
    """Bytes of one all-gather's full buffer: ``params`` in 16-bit, or qwZ's int8 + scales over ``n`` ranks."""
    if not plan.zero_quantized_weights:
        return params * param_bytes
    return n * quantized_bytes(_elements(params / n), 8)


def gather(plan, params: float, param_bytes: int, primary: bool) -> tuple[Collective, float]:
    """(the all-gather of a unit of ``params``, HBM bytes of its qwZ kernels); ``primary``: the step's first
    gather of the unit (hpZ: over all of dp, the later ones over the sub-group)."""
    axis = "dp" if primary or plan.hpz == 1 else "dp_hpz"
    n = plan.dp * plan.cp if axis == "dp" else plan.hpz
    return Collective("all_gather", gather_bytes(plan, params, param_bytes, n), axis), \
        gather_kernel_bytes(plan, params, param_bytes, n)


def gather_kernel_bytes(plan, params: float, param_bytes: int, n: int) -> float:
    """HBM bytes of qwZ's kernels for one all-gather of ``params`` over ``n`` ranks (module docstring)."""
    return params * (param_bytes + 1) * (1 + 1 / n) if plan.zero_quantized_weights else 0.0


def grad_reduce(plan, params: float) -> list[Collective]:
    """qgZ's all-to-alls reducing one bucket of ``params`` gradients (bytes of each full buffer)."""
    n = plan.dp * plan.cp
    g = plan.hpz if plan.hpz > 1 else n
    m, s = n // g, params / n
    out = [Collective("all_to_all", quantized_bytes(_elements(m * s), 4, rows=g, block=_grad_block()),
                      "dp_hpz" if g < n else "dp")]
    if m > 1:
        out.append(Collective("all_to_all", quantized_bytes(_elements(s), 4, rows=m, block=_grad_block()),
                              "dp_hpz_across"))
    return out


def reduce_kernel_bytes(plan, params: float, grad_bytes: int) -> float:
    """HBM bytes qgZ's (de)quantize kernels move for one bucket of ``params`` gradients (module docstring)."""
    n = plan.dp * plan.cp
    g = plan.hpz if plan.hpz > 1 else n
    out = params * (grad_bytes + 0.5 + 0.5 + 4 / g)
    if g < n:
        out += params * ((4 + 0.5) / g + 0.5 / g + 4 / n)
    return out


def secondary_bytes(plan, params: float, param_bytes: int) -> float:
    """hpZ's secondary shard on one rank: ``params`` (the rank's stage) in 16-bit over the g ranks."""
    return params * param_bytes / plan.hpz if plan.hpz > 1 else 0.0
