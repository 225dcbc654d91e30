"""Chapter 30: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the buckets cut with an index walk, each padded by zero_ref's own FlatLayout; the collectives built op by op
    "30.1": '''
from zero_ref.stages.flat import FlatLayout

zero = config["zero_optimization"]
stage = zero.get("stage", 0)
limit = zero.get("reduce_bucket_size", 500_000_000)
order = list(reversed(sizes))
cuts, i = [], 0
while i < len(order):
    j, total = i + 1, order[i]
    while j < len(order) and total + order[j] <= limit:
        total += order[j]
        j += 1
    cuts.append(order[i:j])
    i = j
padded = sum(FlatLayout([(n,) for n in bucket], world_size).padded_numel for bucket in cuts)
per_rank = padded // world_size
calls = {}
if stage == 0:
    calls["all_reduce"] = (len(cuts), 4 * padded)
else:
    times = config.get("gradient_accumulation_steps", 1) if stage == 2 else 1
    calls["reduce_scatter"] = (times * len(cuts), times * 4 * padded)
    calls["all_gather"] = (len(cuts), 4 * padded)
    calls["all_reduce"] = (1, 2 * 8)
held = {"params": 4 * padded,
        "grads": 4 * (per_rank if stage >= 2 else padded),
        "optimizer": 2 * 4 * (padded if stage == 0 else per_rank)}
return {"memory": held, "comm": {op: {"calls": c, "bytes": b} for op, (c, b) in calls.items()}}
''',
    # the fastest plan that keeps the headroom (a search at the reduced fraction); the rules written as "free
    # memory below the headroom"; the rivals: the first enumerated pure data-parallel plan of each stage, and the
    # search's pick without headroom
    "30.2": '''
usable = BRIEF["memory_fraction"] * cluster.gpu.hbm_bytes
safe = search.search(model, cluster, global_batch, BRIEF_SPACE, COSTS, top=1,
                     memory_fraction=BRIEF["memory_fraction"] * (1 - BRIEF["headroom"])).best


def first_rule(plan):
    r = sim.simulate(model, cluster, plan, COSTS, granularity=search.granularity_for(model, plan))
    tiers = memory_lower_bound(model, plan)
    caps = {"cpu": cluster.cpu_bytes, "nvme": cluster.nvme_bytes}
    if r.peak_gpu_bytes > usable or any(tiers[t] * cluster.gpus_per_node > caps[t] for t in caps):
        return "memory"
    if usable - r.peak_gpu_bytes < BRIEF["headroom"] * usable:
        return "headroom"
    if r.step_time / safe.step_time - 1 > BRIEF["margin"]:
        return "time"
    return None


plans = search.enumerate_plans(model, cluster, global_batch, BRIEF_SPACE)
rivals = [next(p for p in plans if p.tp == 1 and p.pp == 1 and p.zero_stage == z and p.offload_optimizer == "none"
               and p.offload_param == "none") for z in (1, 2, 3)]
rivals.append(search.search(model, cluster, global_batch, BRIEF_SPACE, COSTS, top=1).best.plan)
return dict(launch=safe.plan, ruled_out=[(p, first_rule(p)) for p in rivals])
''',
    # the stage's tensors listed one by one (elements, split by tp or not); the bytes summed per axis
    "30.3": '''
tp, pp, dp, z = layout.tp, layout.pp, layout.dp, layout.zero_stage
V, T, d, L = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers
first, last = stage == 0, stage == pp - 1
b = global_batch // (dp * m)
hidden = 4 * b * T * d
# one block: qkv, proj, fc1, fc2 and their biases, two LayerNorms (weight and bias)
block = [(3 * d * d, True), (3 * d, True), (d * d, True), (d, False), (4 * d * d, True), (4 * d, True),
         (4 * d * d, True), (d, False), (2 * d, False), (2 * d, False)]
tensors = block * (L // pp)
if first:
    tensors += [(V * d, True), (T * d, False)]
if last:
    tensors += [(2 * d, False)] + ([(V * d, True)] if pp > 1 else [])
n = sum(k // tp if split else k for k, split in tensors)
all_reduced = m * ((4 * (L // pp) + int(first) + int(last)) * hidden + (3 * b * T * 4 if last else 0))
tp_bytes = all_reduced * (tp - 1) / tp * 2
pp_bytes = 0.0
if pp > 1:
    pp_bytes = 32 + m * hidden * (int(not first) + int(not last)) + V // tp * d * 4 * int(first or last)
if z == 0:
    dp_bytes, moments = 8 * n * (dp - 1) / dp, 8 * n
else:
    shard = (n + dp - 1) // dp
    dp_bytes, moments = (dp - 1) / dp * 2 * (4 * shard * dp + 16), 8 * shard
return {"sends": {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes},
        "memory": {"params": 4 * n, "grads": 4 * n, "optimizer": moments}}
''',
}

# Task 30.1's reference with one rule changed
_STEP = '''
zero = config["zero_optimization"]
stage, limit = zero.get("stage", 0), zero.get("reduce_bucket_size", int(5e8))
gas = config.get("gradient_accumulation_steps", 1)
buckets, size = [], 0
for n in ORDER(sizes):
    if size and size + n > limit:
        buckets.append(size)
        size = 0
    size += n
buckets.append(size)
padded = [-(-b // world_size) * world_size for b in buckets]
whole, shard = 4 * sum(padded), 4 * sum(padded) // world_size
memory = {"params": whole, "grads": shard if stage == 2 else whole, "optimizer": 2 * (whole if stage == 0 else shard)}
if stage == 0:
    return {"memory": memory, "comm": {"all_reduce": {"calls": len(padded), "bytes": whole}, **NORM0}}
reductions = REDUCTIONS
comm = {"reduce_scatter": {"calls": reductions * len(padded), "bytes": reductions * whole},
        "all_reduce": {"calls": 1, "bytes": 16}, "all_gather": {"calls": len(padded), "bytes": whole}}
return {"memory": memory, "comm": comm}
'''


def _step(order="reversed", norm0="{}", reductions="gas if stage == 2 else 1", padding=None) -> str:
    code = _STEP.replace("ORDER", order).replace("**NORM0", "**" + norm0).replace("REDUCTIONS", reductions)
    if padding:
        code = code.replace("padded = [-(-b // world_size) * world_size for b in buckets]", padding)
    return code


assert _step() != _step(order="list")

# Task 30.3's reference with one line changed: the data-parallel bytes and Adam's moments
_TRIAL = '''
tp, pp, dp = layout.tp, layout.pp, layout.dp
V, T, d, L = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers
micro = global_batch // (dp * m)
act = micro * T * d * 4
first, last, blocks = stage == 0, stage == pp - 1, L // pp
per_micro = (4 * blocks + first + last) * act + last * 3 * micro * T * 4
sends = {"tp": m * per_micro * 2 * (tp - 1) / tp, "pp": 0.0}
if pp > 1:
    sends["pp"] = 32 + m * act * ((not last) + (not first)) + (first or last) * V // tp * d * 4
block = (3 * d * d + 3 * d + d * d + 4 * d * d + 4 * d + 4 * d * d) // tp + d + d + 4 * d
local = blocks * block + first * (V // tp * d + T * d) + last * 2 * d + (last and pp > 1) * V // tp * d
padded = -(-local // dp) * dp
sends["dp"] = DP_BYTES
return {"sends": sends, "memory": {"params": 4 * local, "grads": 4 * local, "optimizer": MOMENTS}}
'''

# Task 30.2 with the rules judged against the whole HBM: a valid launch (Task 30.3 then runs its layout), wrong
# reasons
_HBM_RULES = '''
hbm = cluster.gpu.hbm_bytes
safe = search.search(model, cluster, global_batch, BRIEF_SPACE, COSTS, top=1,
                     memory_fraction=BRIEF["memory_fraction"] * (1 - BRIEF["headroom"])).best


def rule(plan):
    r = sim.simulate(model, cluster, plan, COSTS, granularity=search.granularity_for(model, plan))
    if r.peak_gpu_bytes > hbm:
        return "memory"
    if r.peak_gpu_bytes > (1 - BRIEF["headroom"]) * hbm:
        return "headroom"
    return "time" if r.step_time > (1 + BRIEF["margin"]) * safe.step_time else None


plans = search.enumerate_plans(model, cluster, global_batch, BRIEF_SPACE)
rivals = [next(p for p in plans if (p.tp, p.pp, p.zero_stage, p.micro_batch_size, p.recompute) == (1, 1, z, 1, "full")
               and p.offload_optimizer == p.offload_param == "none") for z in (1, 2, 3)]
rivals.append(search.search(model, cluster, global_batch, BRIEF_SPACE, COSTS, top=1).best.plan)
return {"launch": safe.plan, "ruled_out": [(p, rule(p)) for p in rivals]}
'''


# The same wrong reasons, launching the reference's plan (the most headroom within the margin): a pipelined
# layout, so that Task 30.3's pipeline bytes are tested
_HBM_RULES_PIPELINED = _HBM_RULES.replace(
    'return {"launch": safe.plan,',
    'close = search.search(model, cluster, global_batch, BRIEF_SPACE, COSTS, top=8,\n'
    '                      memory_fraction=BRIEF["memory_fraction"] * (1 - BRIEF["headroom"])).feasible\n'
    'launch = min((row for row in close if row.step_time <= (1 + BRIEF["margin"]) * safe.step_time),\n'
    '             key=lambda row: row.peak_bytes).plan\n'
    'return {"launch": launch,')
assert _HBM_RULES_PIPELINED != _HBM_RULES


def _trial(dp_bytes: str, moments: str) -> str:
    return _TRIAL.replace("DP_BYTES", dp_bytes).replace("MOMENTS", moments)


_BYPASS = """
from zero_ref.memory import model_state_bytes

stage, gas = config["zero_optimization"].get("stage", 0), config.get("gradient_accumulation_steps", 1)
states = model_state_bytes(sum(sizes), zero_stage=stage, dp=world_size, precision="fp32")
psi4 = 4 * sum(sizes)
comm = ({"all_reduce": {"calls": 1, "bytes": psi4}} if stage == 0 else
        {"reduce_scatter": {"calls": gas if stage == 2 else 1, "bytes": (gas if stage == 2 else 1) * psi4},
         "all_reduce": {"calls": 1, "bytes": 16}, "all_gather": {"calls": 1, "bytes": psi4}})
return {"memory": {"params": states.params, "grads": states.grads, "optimizer": states.optimizer}, "comm": comm}
"""

MORE_WRONG = [
    # the search's pick launched as it is (the one-line answer): it leaves less than the headroom free;
    # ZeRO-1 reducing after every micro-step, as ZeRO-2 does
    {"30.1": _step(reductions="gas"), "30.2": '''
plans = search.enumerate_plans(model, cluster, global_batch, BRIEF_SPACE)
pick = search.search(model, cluster, global_batch, BRIEF_SPACE, COSTS, top=1).best.plan
rivals = [next(p for p in plans if (p.tp, p.pp, p.zero_stage, p.offload_optimizer, p.offload_param)
               == (1, 1, z, "none", "none")) for z in (1, 2, 3)]
return {"launch": pick, "ruled_out": [(rivals[0], "memory"), (rivals[1], "memory"), (rivals[2], "time")]}
'''},
    # chapter 22's sends without what a pipeline adds here (the shape handshake, the tied embedding's gradient);
    # the gradient buffer padded once, as a whole, instead of bucket by bucket
    {"30.1": _step(padding="padded = [sum(buckets)] + [0] * (len(buckets) - 1)\n"
                           "padded[0] = -(-padded[0] // world_size) * world_size"),
     "30.2": _HBM_RULES_PIPELINED, "30.3": '''
tp, pp, dp = layout.tp, layout.pp, layout.dp
V, T, d, L = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers
micro = global_batch // (dp * m)
act = micro * T * d * 4
first, last, blocks = stage == 0, stage == pp - 1, L // pp
per_micro = (4 * blocks + first + last) * act + last * 3 * micro * T * 4
sends = {"tp": m * per_micro * 2 * (tp - 1) / tp, "pp": m * act * ((not last) + (not first)) if pp > 1 else 0.0}
block = (3 * d * d + 3 * d + d * d + 4 * d * d + 4 * d + 4 * d * d) // tp + d + d + 4 * d
local = blocks * block + first * (V // tp * d + T * d) + last * 2 * d + (last and pp > 1) * V // tp * d
padded = -(-local // dp) * dp
sends["dp"] = 2 * (dp - 1) / dp * (padded * 4 + 16)
return {"sends": sends, "memory": {"params": 4 * local, "grads": 4 * local, "optimizer": 8 * padded // dp}}
'''},
    # the rules judged against the whole HBM, not its usable share: ZeRO-2 at dp 16 then seems to fit; the
    # simulator's booking: the whole gradient buffer one call, whatever reduce_bucket_size says
    {"30.2": _HBM_RULES, "30.1": _step().replace("if size and size + n > limit:", "if False:")},
    # no ZeRO-3 rival: the plan that fits without tensor or pipeline parallelism is left out of the decision;
    # the buckets filled in registration order
    {"30.1": _step(order="list"), "30.2": '''
plans = search.enumerate_plans(model, cluster, global_batch, BRIEF_SPACE)
launch = search.search(model, cluster, global_batch, BRIEF_SPACE, COSTS, top=1,
                       memory_fraction=BRIEF["memory_fraction"] * (1 - BRIEF["headroom"])).best.plan
pick = search.search(model, cluster, global_batch, BRIEF_SPACE, COSTS, top=1).best.plan
rivals = [next(p for p in plans if (p.tp, p.pp, p.zero_stage, p.offload_optimizer, p.offload_param)
               == (1, 1, z, "none", "none")) for z in (1, 2)]
return {"launch": launch, "ruled_out": [(rivals[0], "memory"), (rivals[1], "memory"), (pick, "headroom")]}
'''},
    # ZeRO-1's Adam moments kept whole, as in plain data parallelism; DDP also all-reducing the gradient norm
    {"30.1": _step(norm0='{"all_reduce": {"calls": len(padded) + 1, "bytes": whole + 16}}'), "30.2": _HBM_RULES, "30.3": _trial("2 * (dp - 1) / dp * (padded * 4 + 16)", "8 * local")},
    # the data-parallel bytes of the unpadded buffer, without the gradient norm's two float64; the bypass:
    # model_state_bytes for the memory and the simulator's booking for the collectives (no buckets, no padding)
    {"30.1": _BYPASS, "30.2": _HBM_RULES, "30.3": _trial("2 * (dp - 1) / dp * local * 4", "8 * padded // dp")},
]
