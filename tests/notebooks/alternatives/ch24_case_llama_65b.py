"""Chapter 24: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

# Task 24.2 uses Task 24.1's function: a release that grades a 24.2 answer also answers 24.1 (correctly).
_PEAK = '''
states = model_state_bytes(model.num_params, zero_stage=plan.zero_stage, dp=plan.dp, tp=plan.tp, pp=plan.pp,
                           precision="bf16").total
layers_held = min(plan.pp, plan.num_microbatches) * (model.layers // plan.pp)
kept = model.activation_terms(plan.micro_batch_size, tp=plan.tp, sp=plan.sequence_parallel,
                              recompute=plan.recompute, attention=plan.attention)
everything = model.activation_terms(plan.micro_batch_size, tp=plan.tp, sp=plan.sequence_parallel,
                                    recompute="none", attention=plan.attention)
return states + layers_held * kept.total + (everything.total - kept.total)
'''

# Task 24.2's mistakes carry their own count: in their release Task 24.1 is a stub.
_INLINE = "def peak(plan):\n    model = LLAMA" + _PEAK.replace("\n", "\n    ").rstrip()

RIGHT = {
    # the model states from zero_ref.memory instead of written out
    "24.1": _PEAK,
    # the candidates sorted by simulated step time, the first that fits taken
    "24.2": '''
timed = sorted(CANDIDATES, key=lambda p: sim.simulate(LLAMA, CLUSTER, p, COSTS, granularity="stage").step_time)
return next(p for p in timed if stage0_peak_bytes(LLAMA, p) <= limit)
''',
}

MORE_WRONG = [
    # the seed's slip: the optimizer states divided by TP and DP, the pipeline split forgotten
    {"24.1": '''
local = model.num_params / (plan.tp * plan.pp)
d, z = plan.dp, plan.zero_stage
states = local * (2 + 2 / (d if z >= 2 else 1)) + 12 * model.num_params / plan.tp / (d if z >= 1 else 1)
kept = model.activation_terms(plan.micro_batch_size, tp=plan.tp, sp=plan.sequence_parallel, recompute=plan.recompute,
                              attention=plan.attention).total
none = model.activation_terms(plan.micro_batch_size, tp=plan.tp, sp=plan.sequence_parallel, recompute="none",
                              attention=plan.attention).total
return states + min(plan.pp, plan.num_microbatches) * (model.layers // plan.pp) * kept + none - kept
'''},
    # the gradients left out (the seed's 910 GB)
    {"24.1": '''
local = model.num_params / (plan.tp * plan.pp)
states = local * (2 + 12 / (plan.dp if plan.zero_stage >= 1 else 1))
kept = model.activation_terms(plan.micro_batch_size, tp=plan.tp, sp=plan.sequence_parallel, recompute=plan.recompute,
                              attention=plan.attention).total
none = model.activation_terms(plan.micro_batch_size, tp=plan.tp, sp=plan.sequence_parallel, recompute="none",
                              attention=plan.attention).total
return states + min(plan.pp, plan.num_microbatches) * (model.layers // plan.pp) * kept + none - kept
'''},
    # p micro-batches in flight even when the step has fewer
    {"24.1": _PEAK.replace("min(plan.pp, plan.num_microbatches)", "plan.pp")},
    # one micro-batch in flight, as if the pipeline held no more than a plain forward does
    {"24.1": _PEAK.replace("min(plan.pp, plan.num_microbatches)", "1")},
    # full recomputation's rebuilt layer forgotten
    {"24.1": _PEAK.replace("(everything.total - kept.total)", "0")},
    # ZeRO-2's division of the gradients forgotten (only the optimizer states divided by d)
    {"24.1": _PEAK.replace("zero_stage=plan.zero_stage", "zero_stage=min(plan.zero_stage, 1)")},
    # the largest micro-batch that fits (fewer, larger micro-batches are not faster: the bubble grows)
    {"24.2": _INLINE + """
return max((p for p in CANDIDATES if peak(p) <= limit),
           key=lambda p: (p.micro_batch_size, p.recompute == "none", p.sequence_parallel))
"""},
    # the plan with the most headroom, as if the least memory were the fastest
    {"24.2": _INLINE + """
return min(CANDIDATES, key=peak)
"""},
    # memory ignored: the fastest candidate, which fits none of the check's GPUs
    {"24.2": """
return min(CANDIDATES, key=lambda p: sim.simulate(LLAMA, CLUSTER, p, COSTS, granularity="stage").step_time)
"""},
    # the seed's layout kept (TP 8 × PP 8): right only where memory is tightest
    {"24.2": _INLINE + """
fitting = [p for p in CANDIDATES if (p.tp, p.pp) == (8, 8) and peak(p) <= limit]
return min(fitting, key=lambda p: sim.simulate(LLAMA, CLUSTER, p, COSTS, granularity="stage").step_time)
"""},
    # time ignored: the fitting plan that uses the memory best (the largest peak under the limit)
    {"24.2": _INLINE + """
return max((p for p in CANDIDATES if peak(p) <= limit), key=peak)
"""},
    # the seed's own conclusion: "the model states fit, so the plan fits" (activations left out)
    {"24.2": """
fitting = [p for p in CANDIDATES if model_state_bytes(LLAMA.num_params, zero_stage=1, dp=4, tp=8, pp=8).total <= limit]
return min(fitting, key=lambda p: sim.simulate(LLAMA, CLUSTER, p, COSTS, granularity="stage").step_time)
"""},
]
