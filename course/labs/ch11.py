"""Chapter 11's save-under-ZeRO-3 experiment: a student's consolidation run on real ranks, and what it gathered.

``zero_ref.launch(saved_on_ranks, 2, gpt2_config, ds_config, batches, save)`` runs it.
"""
from __future__ import annotations


def saved_on_ranks(rank, world, gpt2_config, ds_config, batches, save):
    """GPT-2 built under ``hf.Init`` and trained at stage 3 on ``batches[step][rank]``, then ``save(model)``.

    Returns what ``save`` returned, the most elements gathered at once while it ran (persistent units
    included), the bound one module at a time allows (persistent units + the largest other unit), every
    parameter gathered at once afterwards (the truth, by ``named_parameters(remove_duplicate=False)``) and
    the engine's ``_zero3_consolidated_16bit_state_dict`` (DeepSpeed's own consolidation)."""
    import torch
    import transformers

    from zero_ref.ds import hf
    from zero_ref.ds.engine import initialize
    from zero_ref.stages import zero3
    from zero_ref.stages.zero3.unit import Unit

    torch.manual_seed(0)
    with hf.Init():
        model = transformers.GPT2LMHeadModel(gpt2_config)
    engine, *_ = initialize(model=model, config=ds_config)
    for step_batches in batches:
        ids = step_batches[rank]
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()

    units = [u for u in dict.fromkeys(map(zero3.unit_of, model.parameters())) if u is not None]
    persistent = [u for u in units if u.full is not None]          # gathered between steps: kept whole
    peak, gather = [0], Unit.gather

    def counted(unit, *args, **kwargs):          # after each gather: the elements gathered right now
        gather(unit, *args, **kwargs)
        peak[0] = max(peak[0], sum(u.numel for u in units if u.full is not None))

    Unit.gather = counted
    try:
        saved = save(model)
    finally:
        Unit.gather = gather
    with zero3.GatheredParameters(list(model.parameters())):
        truth = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    library = engine._zero3_consolidated_16bit_state_dict()
    bound = sum(u.numel for u in persistent) + max(u.numel for u in units if u not in persistent)
    return {"saved": saved, "peak": peak[0], "bound": bound, "total": sum(u.numel for u in units),
            "truth": truth, "library": library}
