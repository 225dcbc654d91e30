"""Chapter 28: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # through trace_spans instead of the raw JSON; a Counter, not a dict
    "28.1": '''
spans = trace_spans(trace_path)
length = max(s["end"] for s in spans if s["track"] == "step")
on_gloo = sum(s["end"] - s["start"] for s in spans if s["track"] == "comm")
ops = Counter(C10D_OPS[s["name"]] for s in spans if s["track"] == "comm call")
return dict(step=length, comm=on_gloo, collectives=ops)
''',
    # another stage: ZeRO-1 with micro-batch 8 (one reduction per step), the serial step from sim_spans
    "28.2": '''
KNOB = StepSpec(1, 8, gas=1)
described = lambda spec: {"stage": spec.stage, "micro_batch": spec.micro_batch, "gas": spec.gas, "world_size": 2}
serial = lambda spec: sum(s["end"] - s["start"] for s in sim_spans(fit.simulate(described(spec))))
predicted_collectives = Counter(c[0] for c in work_totals(gpt_model(COURSE_GPT), plan_for(described(KNOB)))["collectives"])
predicted_saving = serial(BASELINE) - serial(KNOB)
''',
}

_READ = '''
spans = trace_spans(trace_path)
step = next(s["end"] for s in spans if s["track"] == "step")
'''

MORE_WRONG = [
    # the collectives named by gloo's track: the reduce-scatters counted as all-reduces
    {"28.1": _READ + '''comm = [s for s in spans if s["track"] == "comm"]
return {"step": step, "comm": sum(s["end"] - s["start"] for s in comm), "collectives": dict(Counter(s["name"] for s in comm))}
'''},
    # both communication tracks counted: each collective twice, its time twice (the caller's wait and gloo's work)
    {"28.1": _READ + '''both = [s for s in spans if s["track"] in ("comm", "comm call")]
return {"step": step, "comm": sum(s["end"] - s["start"] for s in both),
        "collectives": dict(Counter(C10D_OPS.get(s["name"], s["name"]) for s in both))}
'''},
    # every recorded step summed instead of the median one
    {"28.1": '''
with open(trace_path) as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
steps = [e for e in events if e["name"] == "step" and e.get("cat") == "user_annotation"]
return {"step": sum(e["dur"] for e in steps) * 1e-6,
        "comm": sum(e["dur"] for e in events if e["name"].startswith("gloo:")) * 1e-6,
        "collectives": dict(Counter(C10D_OPS[e["name"]] for e in events if e["name"] in C10D_OPS))}
'''},
    # a knob that also changes the global batch: 4 sequences per rank per step instead of 8
    {"28.2": '''
KNOB = StepSpec(2, 4)
plan = plan_for(dict(stage=2, micro_batch=4, gas=1, world_size=2))
predicted_collectives = dict(Counter(op for op, _, _ in work_totals(fit.model, plan)["collectives"]))
busy = lambda spec: sum(float(v[0]) for v in fit.simulate(dict(stage=spec.stage, micro_batch=spec.micro_batch,
                                                               gas=spec.gas, world_size=2)).busy.values())
predicted_saving = busy(BASELINE) - busy(KNOB)
'''},
    # the predicted counts copied from the baseline's trace, not the knob's plan
    {"28.2": '''
KNOB = StepSpec(2, 8)
predicted_collectives = {"reduce_scatter": 8, "all_reduce": 1, "all_gather": 1}
busy = lambda spec: sum(float(v[0]) for v in fit.simulate(dict(stage=spec.stage, micro_batch=spec.micro_batch,
                                                               gas=spec.gas, world_size=2)).busy.values())
predicted_saving = busy(BASELINE) - busy(KNOB)
'''},
    # the saving taken the wrong way round (the knob's step minus the baseline's): its sign is not the measurement's
    {"28.2": '''
KNOB = StepSpec(2, 8)
described = lambda spec: dict(stage=spec.stage, micro_batch=spec.micro_batch, gas=spec.gas, world_size=2)
predicted_collectives = dict(Counter(op for op, _, _ in work_totals(fit.model, plan_for(described(KNOB)))["collectives"]))
predicted_saving = fit.predict(described(KNOB)) - fit.predict(described(BASELINE))
'''},
    # ZeRO-3 at the same split, against the brief: the simulator's plan counts its collectives otherwise than
    # zero_ref's trace (16 per micro-step), and it needs more collectives, not fewer
    {"28.2": '''
KNOB = StepSpec(3, 1, gas=8)
described = lambda spec: dict(stage=spec.stage, micro_batch=spec.micro_batch, gas=spec.gas, world_size=2)
predicted_collectives = dict(Counter(op for op, _, _ in work_totals(fit.model, plan_for(described(KNOB)))["collectives"]))
predicted_saving = fit.predict(described(BASELINE)) - fit.predict(described(KNOB))
'''},
]
