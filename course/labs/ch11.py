"""Chapter 11's experiments on real ranks: GPT-2 at every stage (``chapter_run``), the Trainer with DeepSpeed beside
zero_ref's engine (``trainer_beside_zero_ref``), and a consolidation under ZeRO-3 (``saved_on_ranks``, Task 11.1).
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


def chapter_run(rank, world_size, ds_config, gpt2_config, batch, micro, steps):
    """GPT-2 built in full, under hf.Init and under zero3.Init (what each rank holds, the values); then trained
    with ds_config at stages 0-2 for 3 steps and at stage 3 (built under hf.Init) for ``steps``, on this rank's
    rows of ``batch(step, n)``: losses, one step's collectives, bytes held by category."""
    import contextlib
    import torch
    import transformers
    from zero_ref import comm
    from zero_ref.ds import hf
    from zero_ref.stages import zero3
    from zero_ref.ds.engine import initialize
    from zero_ref.measure import unique_storage_bytes

    out = {}
    for how, ctx in (("in full", contextlib.nullcontext), ("hf.Init", hf.Init), ("zero3.Init", zero3.Init)):
        torch.manual_seed(0)
        with ctx():
            model = transformers.GPT2LMHeadModel(gpt2_config)
        units = [u for u in dict.fromkeys(map(zero3.unit_of, model.parameters())) if u is not None]
        held = unique_storage_bytes([*model.parameters(), *(u.part for u in units)])
        with zero3.GatheredParameters(list(model.parameters())):
            values = [p.detach().clone() for p in model.parameters()]
        out[how] = {"held": held, "values": values}

    for stage in (0, 1, 2, 3):
        cfg = {**ds_config, "zero_optimization": {**ds_config["zero_optimization"], "stage": stage}}
        torch.manual_seed(0)
        with hf.Init() if stage == 3 else contextlib.nullcontext():
            model = transformers.GPT2LMHeadModel(gpt2_config)
        engine, *_ = initialize(model=model, config=cfg)
        losses = []
        for step in range(steps if stage == 3 else 3):
            ids = batch(step, micro * world_size)[rank * micro:(rank + 1) * micro]   # this rank's slice
            with comm.recording() as log:
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
            losses.append(loss.item())
            if step == 1:                                                # a step after the first (traced) one
                step_comm = [(r.op, r.dtype, r.bytes) for r in log.records]
        opt = engine.optimizer
        persistent = sum(u.numel for u in getattr(opt, "units", []) if u.persistent)
        run = {"losses": losses, "comm": step_comm, "persistent": persistent,
               "held": {k: unique_storage_bytes(v) for k, v in opt.state_tensors().items()},
               "visible": sum(p.numel() for p in model.parameters()), "num_parameters": model.num_parameters()}
        if stage == 3:
            with zero3.GatheredParameters(list(model.parameters())):
                run["weights"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        out[stage] = run
    return out



def trainer_beside_zero_ref(rank, world_size, ds_config, zero_ref_config, gpt2_config, batch, micro, steps):
    """transformers.Trainer + DeepSpeed on this rank for ``steps``; then zero_ref's engine from the same weights on the
    same batches, with the model's loss and with it scaled by (seq - 1)/seq (the loss the Trainer backpropagates)."""
    import copy
    import os
    import tempfile
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    import deepspeed.ops
    import torch
    import transformers
    from accelerate import PartialState
    from zero_ref.ds.engine import initialize
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False   # gloo does every collective: no C++ build
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo")                 # the state accelerate cannot pick by itself on a CPU-only machine
    del os.environ["ACCELERATE_USE_DEEPSPEED"]

    cfg = copy.deepcopy(ds_config)
    cfg["optimizer"]["params"]["torch_adam"] = True
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=micro, max_steps=steps, learning_rate=1e-2,
        weight_decay=0.0, adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="constant", logging_steps=1,
        save_strategy="no", report_to=[], disable_tqdm=True, deepspeed=cfg, accelerator_config={"use_configured_state": True})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(gpt2_config)          # under deepspeed.zero.Init: stage 3
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = []                                                           # the batches this rank's steps use, in order

    def collate(rows):
        ids = torch.stack([r["input_ids"] for r in rows])
        seen.append(ids)
        return {"input_ids": ids, "labels": ids}

    rows = batch(0, micro * world_size * steps)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=[{"input_ids": r} for r in rows],
                                   data_collator=collate)
    trainer.train()
    out = {"trainer": [h["loss"] for h in trainer.state.log_history if "loss" in h],   # the mean over the ranks
           "engine": type(trainer.model_wrapped).__name__,
           "resolved": trainer.accelerator.state.deepspeed_plugin.deepspeed_config["zero_optimization"],
           "num_parameters": model.num_parameters()}                   # between steps, partitioned

    seq = rows.shape[1]
    for scale in (1.0, (seq - 1) / seq):          # the model's own loss; the loss the Trainer backpropagates (below)
        twin = transformers.GPT2LMHeadModel(gpt2_config)
        twin.load_state_dict(start, strict=False)                       # lm_head.weight is tied to wte
        engine, *_ = initialize(model=twin, config=zero_ref_config)
        losses = []
        for ids in seen[:steps]:
            loss = engine(input_ids=ids, labels=ids).loss * scale
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        out[scale] = losses
    return out

