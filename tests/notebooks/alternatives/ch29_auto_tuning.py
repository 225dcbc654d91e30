"""Chapter 29: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # a heap of the candidates and a while loop; the top k kept with bisect.insort
    "29.1": '''
import bisect
import heapq

heap = []
for i, plan in enumerate(search.enumerate_plans(model, cluster, global_batch, space)):
    if memory_lower_bound(model, plan)["total"] <= limit:
        g = search.granularity_for(model, plan)
        heapq.heappush(heap, (time_lower_bound(model, cluster, plan, COSTS, granularity=g), i, g, plan))
times, plans, count = [], [], 0
while heap:
    bound, _, g, plan = heapq.heappop(heap)
    if len(times) >= k and bound > times[k - 1]:
        break
    count += 1
    r = sim.simulate(model, cluster, plan, COSTS, granularity=g)
    if r.peak_gpu_bytes <= limit:
        at = bisect.bisect_right(times, r.step_time)
        times.insert(at, r.step_time)
        plans.insert(at, plan)
return list(zip(times, plans))[:k], count
''',
    # the fp32 recipe written out per category (4 + 4 + 8 bytes, each sharded from its stage on), activations
    # counted on another batch of the same shape, the ranking through (peak, name) pairs
    "29.2": '''
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

_LOOP = '''
candidates = []
for plan in search.enumerate_plans(model, cluster, global_batch, space):
    if memory_lower_bound(model, plan)["total"] > limit:
        continue
    g = search.granularity_for(model, plan)
    candidates.append((time_lower_bound(model, cluster, plan, COSTS, granularity=g), g, plan))
candidates.sort(key=lambda c: c[0])
fitting, simulated = [], 0
for bound, g, plan in candidates:
    if len(fitting) >= k and bound > fitting[k - 1][0]:
        break
    r = sim.simulate(model, cluster, plan, COSTS, granularity=g)
    simulated += 1
    if r.peak_gpu_bytes <= limit:
        fitting = sorted(fitting + [(r.step_time, plan)], key=lambda f: f[0])
return fitting[:k], simulated
'''


def _loop(old: str, new: str) -> str:
    assert _LOOP.count(old) == 1, old
    return _LOOP.replace(old, new)


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
    # 29.1: no stopping rule: every plan that passes the memory prune simulated (the brute force's count)
    {"29.1": _loop("""    if len(fitting) >= k and bound > fitting[k - 1][0]:
        break
""", "")},
    # 29.1: stops at the first bound above the best time, not the k-th best (misses plans of the top k)
    {"29.1": _loop("bound > fitting[k - 1][0]", "bound > fitting[0][0]")},
    # 29.1: a plan whose simulated peak is over the limit kept among the fastest
    {"29.1": _loop("    if r.peak_gpu_bytes <= limit:\n        fitting", "    if True:\n        fitting")},
    # 29.1: simulated in order of the memory bound, not the step-time bound
    {"29.1": _loop("candidates.append((time_lower_bound(model, cluster, plan, COSTS, granularity=g), g, plan))",
                   "candidates.append((memory_lower_bound(model, plan)[\"total\"], g, plan))")},
    # 29.1: no memory prune: plans whose bound is over the limit simulated too (a larger count)
    {"29.1": _loop("""    if memory_lower_bound(model, plan)["total"] > limit:
        continue
""", "")},
    # 29.1: the library's search asked instead of the loop (the check runs the loop with it switched off)
    {"29.1": '''
found = search.search(model, cluster, global_batch, space, COSTS, top=k, memory_fraction=limit / cluster.gpu.hbm_bytes)
return [(r.step_time, r.plan) for r in found.feasible[:k]], found.stats["simulated"]
'''},
    # 29.1: brute force reporting the search's count: every plan simulated, the count copied from a bound rule
    {"29.1": '''
timed = []
for plan in search.enumerate_plans(model, cluster, global_batch, space):
    r = sim.simulate(model, cluster, plan, COSTS, granularity=search.granularity_for(model, plan))
    if r.peak_gpu_bytes <= limit:
        timed.append((r.step_time, plan, time_lower_bound(model, cluster, plan, COSTS,
                                                          granularity=search.granularity_for(model, plan))))
timed.sort(key=lambda t: t[0])
kth = timed[k - 1][0]
fits = [p for p in search.enumerate_plans(model, cluster, global_batch, space) if memory_lower_bound(model, p)["total"] <= limit]
count = sum(time_lower_bound(model, cluster, p, COSTS, granularity=search.granularity_for(model, p)) <= kth for p in fits)
return [(t, p) for t, p, _ in timed[:k]], count
'''},
    # 29.2: the bucket taken as half the gradients (ZeRO-2's peak 19 % above the prediction, outside 1.1 ×)
    {"29.2": _changed("transient = {2: 4 * psi, 3: 4 * psi + 2 * 4 * max(units)}", "transient = {2: 2 * psi, 3: 2 * psi + 2 * 4 * max(units)}")},
    # 29.2: ZeRO-3's gathered unit without its gradients on their way into the bucket (25 % under, outside 1.15 ×)
    {"29.2": _changed("3: 4 * psi + 2 * 4 * max(units)}", "3: 4 * psi + 4 * max(units)}")},
    # 29.2: ZeRO-3 taken for ZeRO-2: its parameters counted whole on every rank (fails the states check)
    {"29.2": _changed("zero_stage=stage,", "zero_stage=min(stage, 2),").replace(_PERSISTENT, "")},
    # 29.2: the persistence threshold forgotten: ZeRO-3's small units counted as sharded too (states 2.6 % under the held bytes)
    {"29.2": _changed(_PERSISTENT, "")},
    # 29.2: every accumulation micro-batch's activations counted as in flight at once (above the measured peak)
    {"29.2": _changed("activations = saved.total", 'activations = plan["gas"] * saved.total')},
    # 29.2: the transient terms left out: states + activations only (ZeRO-2/3's peaks more than 1.2 x the prediction)
    {"29.2": _changed("transient = {2: 4 * psi, 3: 4 * psi + 2 * 4 * max(units)}.get(stage, 0)", "transient = 0")},
    # 29.2: ranked by stage: the highest ZeRO stage taken as the smallest
    {"29.2": _changed('key=lambda name: predict_peak(plans[name])["total"]', 'key=lambda name: -plans[name]["stage"]')},
]
