"""``deepspeed.runtime.zero.partition_parameters``: the names scripts and transformers import from it.

``ZeroParamStatus`` has DeepSpeed's members and values. zero_ref's parameters carry no ``ds_status`` /
``ds_id`` (scripts that gather only parameters with ``ds_id``, as DeepSpeed-Chat's ``_z3_params_to_fetch``
does, gather none: wrap the block in ``GatheredParameters(model.parameters())``). zero_ref's ``Init`` does
not wrap torch's tensor constructors (DeepSpeed's does, to build in the config's dtype and device), so
``zero_wrapper_for_fp_tensor_constructor`` is only the hook transformers' ``prevent_arange_dtype_change``
swaps: it returns the constructor unchanged.
"""
from __future__ import annotations

from enum import Enum

import torch

from zero_ref.ds.accelerator import get_accelerator
from zero_ref.ds.zero import GatheredParameters, Init, register_external_parameter, unregister_external_parameter

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter",
           "ZeroParamStatus", "zero_wrapper_for_fp_tensor_constructor", "get_accelerator"]

_orig_torch_arange = torch.arange


class ZeroParamStatus(Enum):
    AVAILABLE = 1  # gathered: the full tensor is in place
    NOT_AVAILABLE = 2  # partitioned: this rank holds its shard only
    INFLIGHT = 3  # being gathered


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype=None, target_device=None):
    """``fn`` itself: zero_ref's ``Init`` leaves tensor constructors as they are."""
    return fn
