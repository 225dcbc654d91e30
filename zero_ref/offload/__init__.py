"""ZeRO-Offload and ZeRO-Infinity: what moves to the host (and to NVMe), and how the step runs there.

With ``offload_optimizer={"device": "cpu"}`` (stages 1–3) each rank keeps on the **host** what
its optimizer owns — the fp32 master partition, both Adam moments and an fp32 gradient
partition — and on the **device** only the 16-bit parameters (and, in stage 1, the full 16-bit
gradient buffer it accumulates in). A step then crosses the host link twice:

    backward:  bucket reduced (reduce-scatter)  →  its 16-bit shard copied to the host, added
               into the fp32 gradient partition (``add_grad``, as each bucket completes)
    step:      norm / clipping / Adam on the host (Numba CPU Adam)  →  the updated partition,
               cast to 16 bits, copied back into the device parameters  →  all-gather (stage 1–2)

Per rank and step that is 2 · Ψ/N bytes each way in bf16 (stage 2/3 move gradients on every
micro-step; see ``zero_ref.memory.pcie_bytes_per_step``). On CUDA the copies use pinned host buffers and a
side stream, so gradient copies overlap the rest of backward and the copy of bucket i's
parameters overlaps bucket i+1's Adam. On a CPU-only run the "device" is the CPU: the same
code path runs, the copies are plain CPU copies, and the bytes are counted all the same.

``offload_param={"device": "cpu"}`` (stage 3) keeps each unit's 16-bit partition on the host
between uses; it is copied to the device just before the unit's all-gather. With ``"nvme"``
(ZeRO-Infinity) the optimizer states (and the parameter partitions) live in files under
``nvme_path``, swapped in sub-groups of ``sub_group_size`` elements by ``offload/nvme.py``.

The stages call the wing at five points (``place`` in ``new_partition``, ``attach`` after
the buckets exist, ``add_grad`` when a reduced gradient shard is ready, ``grad_partitions`` and
``step`` in ``ZeroOptimizerBase.step``); everything else about them is unchanged.

Simplified vs DeepSpeed (0.19.8): gradients cross the link in 16 bits and are converted on the
host (DeepSpeed's stage 1/2 converts on the GPU and copies fp32: 4 bytes per element), and
accumulate on the host in fp32 (DeepSpeed: in 16 bits, on the GPU for stages 1/2, in a host
buffer for stage 3); there is no 16-bit host copy of the partition kept between steps (DeepSpeed
keeps one, pinned, as its copy-back staging buffer); no ``ratio`` < 1 (partial offload), no
``super_offload``; ``fast_init`` is accepted and does nothing. ZeRO-Infinity keeps the fp32
gradient partition in host memory (DeepSpeed writes it to NVMe at the boundary and reads it back
in the step: 8Ψ/N more NVMe bytes per step for 4Ψ/N less host memory); ``offload_param`` on NVMe
needs ``offload_optimizer`` on NVMe too (one versioned store commits both atomically).

The wing: ``link`` (the counted host link), ``optimizer`` (``OptimizerOffload``: the optimizer partition
on the host or on NVMe, and the host Adam), ``params`` (``ParamOffload``: ZeRO-3 partitions between
uses), ``nvme`` (files, versions and sub-group swapping), ``build`` (``make`` from DeepSpeed's sections,
``tier_bytes`` measured). The traffic formulas are torch-free, in ``zero_ref.memory``. This face only
re-exports.
"""
from zero_ref.memory import nvme_bytes_per_step, pcie_bytes_per_step
from zero_ref.offload.build import make, parse_configs, tier_bytes
from zero_ref.offload.link import Link
from zero_ref.offload.optimizer import CPU_ADAM, OptimizerOffload
from zero_ref.offload.params import ParamOffload

__all__ = ["make", "parse_configs", "tier_bytes", "Link", "OptimizerOffload", "ParamOffload", "CPU_ADAM",
           "pcie_bytes_per_step", "nvme_bytes_per_step"]
