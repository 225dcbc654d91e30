"""Chapter 29: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # collect every plan that fits, then take the first fastest with min(); a list, not a tuple
    "29.2": '''
fitting = []
for plan in search.enumerate_plans(model, cluster, global_batch, space):
    r = sim.simulate(model, cluster, plan, COSTS, granularity=search.granularity_for(model, plan))
    if r.peak_gpu_bytes <= limit:
        fitting.append((r.step_time, plan))
step_time, plan = min(fitting, key=lambda f: f[0])
return [step_time, plan]
''',
    # the fp32 recipe written out per category (4 + 4 + 8 bytes, each sharded from its stage on), activations
    # counted on another batch of the same shape, the ranking through (peak, name) pairs
    "29.3": '''
def predict_peak(plan, cfg=CFG29, dp=2):
    model = GPT(cfg)
    psi = sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    st = plan["stage"]

    def per_rank(n, from_stage):
        return n / dp if st >= from_stage else n

    partitioned = sum(n for n in blocks if n > PERSISTENCE)
    states = 4 * (per_rank(partitioned, 3) + psi - partitioned) + 4 * per_rank(psi, 2) + 8 * per_rank(psi, 1)
    idx, targets = make_batch(cfg, plan["micro_batch"], seed=1)
    with saved_activation_bytes(model) as acts:
        model(idx, targets)
    gathered = 4 * max(blocks) if st == 3 else 0
    unreduced = {2: 4 * psi, 3: 4 * psi + 4 * max(blocks)}.get(st, 0)
    return dict(total=states + acts.total + gathered + unreduced, states=states, activations=acts.total,
                transient=gathered + unreduced)


def rank_plans(plans):
    scored = [(predict_peak(p)["total"], name) for name, p in plans.items()]
    return [name for _, name in sorted(scored)]
''',
}

WRONG = {
    # every in-flight micro-batch charged for all L layers, not the L/p of the first stage
    "29.1": '''
states = model_state_bytes(model.num_params, zero_stage=plan.zero_stage, dp=plan.dp,
                           precision=plan.precision, tp=plan.tp, pp=plan.pp).total
per_layer = model.activation_terms(plan.micro_batch_size, tp=plan.tp, sp=plan.sequence_parallel,
                                   attention=plan.attention).total
return states + min(plan.pp, plan.num_microbatches) * model.layers * per_layer
''',
}

# The reference's answer; each mistake below changes one line of it.
_PREDICT = '''
def predict_peak(plan, cfg=CFG29, dp=2):
    torch.manual_seed(0)
    model = GPT(cfg)
    psi = sum(p.numel() for p in model.parameters())
    stage = plan["stage"]
    units = [sum(p.numel() for p in block.parameters()) for block in model.blocks]
    states = model_state_bytes(psi, zero_stage=stage, dp=dp, precision="fp32").total
    if stage == 3:
        states += 4 * (psi - sum(n for n in units if n > PERSISTENCE)) * (dp - 1) / dp
    idx, targets = make_batch(cfg, plan["micro_batch"], seed=0)
    with saved_activation_bytes(model) as saved:
        model(idx, targets)
    activations = saved.total
    transient = {2: 4 * psi, 3: 4 * psi + 2 * 4 * max(units)}.get(stage, 0)
    return {"states": states, "activations": activations, "transient": transient,
            "total": states + activations + transient}


def rank_plans(plans):
    return sorted(plans, key=lambda name: predict_peak(plans[name])["total"])
'''
_PERSISTENT = """    if stage == 3:
        states += 4 * (psi - sum(n for n in units if n > PERSISTENCE)) * (dp - 1) / dp
"""


def _changed(old: str, new: str) -> str:
    assert _PREDICT.count(old) == 1, old
    return _PREDICT.replace(old, new)


MORE_WRONG = [
    # 29.3: ZeRO-3 taken for ZeRO-2: its parameters counted whole on every rank (fails the states check)
    {"29.3": _changed("zero_stage=stage,", "zero_stage=min(stage, 2),").replace(_PERSISTENT, "")},
    # 29.3: the persistence threshold forgotten: ZeRO-3's small units counted as sharded too (states 2.6 % under the held bytes)
    {"29.3": _changed(_PERSISTENT, "")},
    # 29.3: every accumulation micro-batch's activations counted as in flight at once (above the measured peak)
    {"29.3": _changed("activations = saved.total", 'activations = plan["gas"] * saved.total')},
    # 29.3: the transient terms left out: states + activations only (ZeRO-2/3's peaks more than 1.2 x the prediction)
    {"29.3": _changed("transient = {2: 4 * psi, 3: 4 * psi + 2 * 4 * max(units)}.get(stage, 0)", "transient = 0")},
    # 29.3: ranked by stage: the highest ZeRO stage taken as the smallest
    {"29.3": _changed('key=lambda name: predict_peak(plans[name])["total"]', 'key=lambda name: -plans[name]["stage"]')},
]
