"""ZeRO-Offload and ZeRO-Infinity: what moves to the host (and to NVMe), and how the step runs there.

``optimizer`` holds the offload itself (see its docstring), ``nvme`` the files, versions and sub-group
swapping of ZeRO-Infinity. This face only re-exports.
"""
from zero_ref.offload.optimizer import (CPU_ADAM, Link, OptimizerOffload, ParamOffload, make, nvme_bytes_per_step,
                                        parse_configs, pcie_bytes_per_step, tier_bytes)

__all__ = ["make", "parse_configs", "tier_bytes", "Link", "OptimizerOffload", "ParamOffload", "CPU_ADAM",
           "pcie_bytes_per_step", "nvme_bytes_per_step"]
