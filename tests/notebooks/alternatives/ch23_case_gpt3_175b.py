"""Chapter 23: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the walk kept as an explicit list of held chunks; Korthikanti's closed forms in floats
    # (sbh·34/t kept per layer with SP + selective recomputation, 5as²b/t for the recomputed core)
    "23.1": '''
p, m, v = plan.pp, plan.num_microbatches, plan.virtual
s, b, h, a, t = model.seq, plan.micro_batch_size, model.hidden, model.heads, plan.tp
chunk_bytes = (model.layers / (p * v)) * 34.0 * s * b * h / t
core = 5.0 * a * s * s * b / t
held, sizes = [], [0.0]
for kind, mb, c in sim.stage_order(plan.schedule, p, m, stage, v):
    if kind == "F":
        held.append((mb, c))
        sizes.append(len(held) * chunk_bytes)
    else:
        sizes.append(len(held) * chunk_bytes + core)
        held.remove((mb, c))
return max(sizes)
''',
    # the cluster sizes tried from the largest down, keeping the last that still meets the deadline
    "23.2": '''
steps = -(-int(tokens) // (batch * GPT3.seq))
answer = None
for nodes in sorted(node_counts, reverse=True):
    row = search.search(GPT3, sim.Cluster.preset("A100-80GB", nodes=nodes), batch, space, COSTS, top=1).best
    if row is not None and steps * row.step_time / 86400 <= deadline_days:
        answer = (nodes, row.plan, steps * row.step_time / 86400)
return answer
''',
}

MORE_WRONG = [
    # the backward frees its chunk before it rebuilds the dropped part: the recomputed core is never counted
    {"23.1": '''
p, m, v = plan.pp, plan.num_microbatches, plan.virtual
kw = dict(tp=plan.tp, sp=True)
sel = activation_bytes_per_layer(model.seq, plan.micro_batch_size, model.hidden, model.heads, recompute="selective", **kw)
full = activation_bytes_per_layer(model.seq, plan.micro_batch_size, model.hidden, model.heads, recompute="none", **kw)
chunk = model.layers // (p * v) * sel
held = peak = 0
for kind, _, _ in sim.stage_order(plan.schedule, p, m, stage, v):
    if kind == "F":
        held += chunk
        peak = max(peak, held)
    else:
        held -= chunk
        peak = max(peak, held + full - sel)
return peak
'''},
    # 1F1B's p − s in flight for every schedule: wrong for GPipe, for interleaving and for m < p
    {"23.1": '''
kw = dict(tp=plan.tp, sp=True)
sel = activation_bytes_per_layer(model.seq, plan.micro_batch_size, model.hidden, model.heads, recompute="selective", **kw)
full = activation_bytes_per_layer(model.seq, plan.micro_batch_size, model.hidden, model.heads, recompute="none", **kw)
return (plan.pp - stage) * (model.layers // plan.pp) * sel + full - sel
'''},
    # a chunk's layers taken as L/p: the interleaved plans' chunks are v times too large
    {"23.1": '''
p, m, v = plan.pp, plan.num_microbatches, plan.virtual
kw = dict(tp=plan.tp, sp=True)
sel = activation_bytes_per_layer(model.seq, plan.micro_batch_size, model.hidden, model.heads, recompute="selective", **kw)
full = activation_bytes_per_layer(model.seq, plan.micro_batch_size, model.hidden, model.heads, recompute="none", **kw)
held = peak = 0
for kind, _, _ in sim.stage_order(plan.schedule, p, m, stage, v):
    if kind == "F":
        held += model.layers // p * sel
        peak = max(peak, held)
    else:
        peak = max(peak, held + full - sel)
        held -= model.layers // p * sel
return peak
'''},
    # the plan searched for the seed's batch of 1024, not the 1536 the deadline is stated in
    {"23.2": '''
steps = math.ceil(tokens / (batch * GPT3.seq))
for nodes in sorted(node_counts):
    best = search.search(GPT3, sim.Cluster.preset("A100-80GB", nodes=nodes), 1024, space, COSTS, top=1).best
    if steps * best.step_time / 86400 <= deadline_days:
        return nodes, best.plan, steps * best.step_time / 86400
return None
'''},
    # DeepSpeed's space searched whatever space is asked for: Megatron's interleaved plans never considered
    {"23.2": '''
steps = math.ceil(tokens / (batch * GPT3.seq))
for nodes in sorted(node_counts):
    best = search.search(GPT3, sim.Cluster.preset("A100-80GB", nodes=nodes), batch, DEEPSPEED, COSTS, top=1).best
    if steps * best.step_time / 86400 <= deadline_days:
        return nodes, best.plan, steps * best.step_time / 86400
return None
'''},
    # every framework given interleaving: DeepSpeed's pipeline engine runs 1F1B only
    {"23.2": '''
steps = math.ceil(tokens / (batch * GPT3.seq))
space = replace(space, schedules=("1f1b", "interleaved"))
for nodes in sorted(node_counts):
    best = search.search(GPT3, sim.Cluster.preset("A100-80GB", nodes=nodes), batch, space, COSTS, top=1).best
    if steps * best.step_time / 86400 <= deadline_days:
        return nodes, best.plan, steps * best.step_time / 86400
return None
'''},
    # Narayanan's way of estimating, used to decide: 6ΨT at an assumed 140 TFLOP/s per GPU, not the
    # simulated step of each cluster's plan (it asks for 96 nodes where Megatron's plans meet the deadline on 64)
    {"23.2": '''
for nodes in sorted(node_counts):
    days = 6 * GPT3.num_params * tokens / (nodes * 8 * 140e12) / 86400
    if days <= deadline_days:
        best = search.search(GPT3, sim.Cluster.preset("A100-80GB", nodes=nodes), batch, space, COSTS, top=1).best
        return nodes, best.plan, days
return None
'''},
]
