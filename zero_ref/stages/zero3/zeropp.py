"""ZeRO++ (Wang et al. 2023, arXiv 2306.10209) on ZeRO-3: which of its three ideas are on, and their groups.

- qwZ (``quantized_weights``): every gather of a unit moves int8 blocks (``quantized_gather.py``);
- hpZ (``hpz_partition_size`` g > 1): a secondary partition inside sub-groups of g ranks; gathers after the
  first one of a step stay in the sub-group (``secondary_partition.py``);
- qgZ (``quantized_gradients``): gradients reduced by a hierarchical int4 all-to-all (``quantized_reduce.py``),
  nodes of g ranks (all ranks when g is 1);
- ``quantized_nontrainable_weights``: frozen units' gathers move int8 blocks even without qwZ.

Per step, a model of Ψ fp16 elements, N ranks in nodes of g: ZeRO-3 moves 2Ψ bytes (full buffers) in forward's
gathers, 2Ψ in backward's and 2Ψ in the reduce-scatter, each mostly across nodes (the paper's 3M, M = 2Ψ).
qwZ makes the gathers Ψ bytes of int8 + 4 bytes per block; hpZ keeps backward's inside the node; qgZ sends Ψ/2
bytes of int4 inside the node and, in its second all-to-all, Ψ/(2g) per rank (all but its own node's share leaves
the node): about Ψ/2 per node.
Across nodes: 0.5M + 0 + 0.25M = 0.75M (tests/zero_ref/test_zeropp.py counts each exactly, scales and padding in).

DeepSpeed's keys (zero_optimization) map one to one; ``zero_ref.initialize`` passes them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from zero_ref.stages.zero3.built_zeropp import ParamZeroPP
from zero_ref.stages.zero3.quantized_reduce import QuantizedReduce
from zero_ref.stages.zero3.secondary_partition import UnitGather, new_subgroups


@dataclass
class ZeroPP:
    quantized_weights: bool = False
    hpz_partition_size: int = 1
    quantized_gradients: bool = False
    quantized_nontrainable_weights: bool = False
    gradient_block: int = 512  # qgZ's block (quantized_reduce.BLOCK)
    subgroup: object = field(default=None, init=False, repr=False)  # hpZ: this rank's sub-group (after build)
    reduce: QuantizedReduce | None = field(default=None, init=False, repr=False)  # qgZ (after build)

    def build(self, group) -> "ZeroPP":
        """Create the sub-groups on this rank (every rank calls it, in the same order); check the sizes."""
        if not self.on:
            return self
        n = dist.get_world_size(group)
        g = min(max(self.hpz_partition_size, 1), n)  # DeepSpeed: min(size, world size); 0 and 1 are off
        if n % g:
            raise ValueError(f"zero_optimization.zero_hpz_partition_size={self.hpz_partition_size} does not divide "
                             f"the {n} data-parallel ranks: use the ranks per node, a divisor of {n}, or 1 (off)")
        self.subgroup = new_subgroups(group, g) if g > 1 else None
        self.reduce = None
        if self.quantized_gradients:
            self.reduce = QuantizedReduce(group, g if g > 1 else n, self.gradient_block)
        return self

    @property
    def on(self) -> bool:
        return self.quantized_weights or self.hpz_partition_size > 1 or self.quantized_gradients or \
            self.quantized_nontrainable_weights

    def unit_gather(self, trainable: bool, built: ParamZeroPP | None = None) -> UnitGather | None:
        """How a (non-persistent) unit is gathered, or None for a plain all-gather. ``built``: what ``zero.Init``
        built its parameters with, which decides hpZ and frozen weights' quantization as in DeepSpeed
        (``built_zeropp.py``)."""
        frozen_quantized = built.quantized_storage if built is not None else \
            not trainable and self.quantized_nontrainable_weights
        subgroup = built.built.subgroup if built is not None else self.subgroup
        quantize = self.quantized_weights or frozen_quantized
        if not quantize and subgroup is None:
            return None
        return UnitGather(quantize, subgroup)

    def differs(self, built: ParamZeroPP, trainable: bool, world: int) -> str:
        """What ``built`` decides otherwise than this config would ('' if nothing)."""
        out = []
        g = min(max(self.hpz_partition_size, 1), world)
        if built.built.hpz_partition_size != g:
            out.append(f"zero_hpz_partition_size {built.built.hpz_partition_size} (initialize's config: {g})")
        if not trainable and built.quantized_storage != self.quantized_nontrainable_weights:
            out.append(f"frozen weights {'' if built.quantized_storage else 'not '}quantized")
        return ", ".join(out)
