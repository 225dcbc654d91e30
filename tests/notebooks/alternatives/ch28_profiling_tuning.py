"""Chapter 28: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # a two-pointer walk over the merged spans instead of every pair of them
    "28.1": '''
with open(trace_path) as f:
    complete = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
annotated = sorted((e for e in complete if e.get("cat") == "user_annotation" and e["name"] == "step"), key=lambda e: e["dur"])
s = annotated[len(annotated) // 2]
lo, hi = s["ts"], s["ts"] + s["dur"]
mine = sorted((e["ts"], -e["dur"]) for e in complete if lo <= e["ts"] < hi and e["tid"] == s["tid"] and e.get("cat") == "cpu_op")
leaves = [(t, t - d) for i, (t, d) in enumerate(mine) if i + 1 == len(mine) or mine[i + 1][0] >= t - d]
gloo = sorted((e["ts"], e["ts"] + e["dur"]) for e in complete if lo <= e["ts"] < hi and e["name"].startswith("gloo:"))


def covered(spans):
    out = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


comm, busy = covered(gloo), covered(sorted(leaves))
both, i, j = 0.0, 0, 0
while i < len(comm) and j < len(busy):   # two pointers over two sorted lists of disjoint spans
    both += max(0.0, min(comm[i][1], busy[j][1]) - max(comm[i][0], busy[j][0]))
    if comm[i][1] < busy[j][1]:
        i += 1
    else:
        j += 1
total = lambda spans: sum(b - a for a, b in spans)
return {"step": s["dur"] / 1e6, "comm": total(comm) / 1e6, "busy": total(busy) / 1e6, "exposed": (total(comm) - both) / 1e6}
''',
    # another stage: ZeRO-1 with one micro-batch of 8; the simulated steps through fit.simulate, the line's
    # intercept written per phase
    "28.2": '''
KNOB = StepSpec(1, 8, gas=1)
plan = lambda s: {"stage": s.stage, "micro_batch": s.micro_batch, "gas": s.gas, "world_size": 2}
steps = measured["steps"]
own = lambda v: sum(v[p] - v["comm"][p] for p in ("forward", "backward"))
fixed = 2 * own(steps["zero1"]["cpu"]) - own(steps["zero0 mb8"]["cpu"])


def predict_saving(base, knob):
    return (fit.simulate(plan(base)).step_time - fit.simulate(plan(knob)).step_time) + (base.gas - knob.gas) * fixed
''',
}

# The reference's answer; each mistake below changes one line of it.
_EXPOSED = '''
with open(trace_path) as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
steps = sorted((e for e in events if e["name"] == "step" and e.get("cat") == "user_annotation"), key=lambda e: e["dur"])
step = steps[len(steps) // 2]
inside = [e for e in events if step["ts"] <= e["ts"] < step["ts"] + step["dur"]]


def union(spans):
    merged = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


ops = sorted((e["ts"], -e["dur"]) for e in inside if e["tid"] == step["tid"] and e.get("cat") == "cpu_op")
ends = [a - d for a, d in ops]
busy = union([(a, b) for (a, _), b, nxt in zip(ops, ends, ops[1:] + [(float("inf"), 0)]) if nxt[0] >= b])
comm = union([(e["ts"], e["ts"] + e["dur"]) for e in inside if e["name"].startswith("gloo:")])
overlap = sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in busy)
length = lambda spans: sum(b - a for a, b in spans) * 1e-6
return {"step": step["dur"] * 1e-6, "comm": length(comm), "busy": length(busy), "exposed": length(comm) - overlap * 1e-6}
'''


def _exposed(old: str, new: str) -> str:
    assert _EXPOSED.count(old) == 1, old
    return _EXPOSED.replace(old, new)


_WRONG_281 = [
    # every gloo span taken as exposed: the caller's own work while gloo runs (its copies, ZeRO-3's compute) not subtracted
    _exposed('"exposed": length(comm) - overlap * 1e-6', '"exposed": length(comm)'),
    # every operator of the caller counted busy, not the innermost: a wait inside AccumulateGrad's hook counts as work
    _exposed("if nxt[0] >= b])", "])"),
    # the operators of every thread counted as the caller's: gloo's own copies taken for the caller's work
    _exposed('if e["tid"] == step["tid"] and e.get("cat") == "cpu_op")', 'if e.get("cat") == "cpu_op")'),
    # the slowest step, the one that stands out in the timeline, not the median one
    _exposed("step = steps[len(steps) // 2]", "step = steps[-1]"),
]

# The reference's knob and line, with the prediction changed
_KNOB = '''
KNOB = StepSpec(stage=2, micro_batch=8)
described = lambda spec: dict(stage=spec.stage, micro_batch=spec.micro_batch, gas=spec.gas, world_size=2)
compute = lambda view: view["forward"] + view["backward"] - view["comm"]["forward"] - view["comm"]["backward"]
c4, c8 = (compute(measured["steps"][name]["cpu"]) for name in ("zero1", "zero0 mb8"))
per_micro_step = 2 * c4 - c8
'''
_LINE = '''

def predict_saving(base, knob):
    return fit.predict(described(base)) - fit.predict(described(knob)) + per_micro_step * (base.gas - knob.gas)
'''

MORE_WRONG = [
    {"28.1": _WRONG_281[0],
     # the simulator alone: the collectives priced, the micro-steps' fixed cost not (about a third of the saving)
     "28.2": _KNOB + '''

def predict_saving(base, knob):
    return fit.predict(described(base)) - fit.predict(described(knob))
'''},
    {"28.1": _WRONG_281[1],
     # a constant: a saving of a second whatever the knob
     "28.2": _KNOB + '''

def predict_saving(base, knob):
    return 1.0
'''},
    {"28.1": _WRONG_281[2],
     # a smaller knob: micro-batches of 2, four micro-steps left (saves well under the best knob)
     "28.2": _KNOB.replace("StepSpec(stage=2, micro_batch=8)", "StepSpec(stage=2, micro_batch=2, gas=4)") + _LINE},
    {"28.1": _WRONG_281[3],
     # a constant of the right size: it cannot order a knob that saves more above one that saves less
     "28.2": _KNOB + '''

def predict_saving(base, knob):
    return 0.15
'''},
    # a knob that also changes the global batch: 4 sequences per rank per step instead of 8
    {"28.2": _KNOB.replace("StepSpec(stage=2, micro_batch=8)", "StepSpec(stage=2, micro_batch=4)") + _LINE},
    # ZeRO-3, against the brief: the simulator counts its collectives otherwise than zero_ref issues them
    {"28.2": _KNOB.replace("StepSpec(stage=2, micro_batch=8)", "StepSpec(stage=3, micro_batch=8)") + _LINE},
]
