"""DeepSpeed's MoE API (``deepspeed.moe``): ``layer.MoE`` and ``utils.split_params_into_different_moe_groups_for_optimizer``,
on zero_ref's expert-parallel dispatch (``zero_ref.parallel.moe``)."""
