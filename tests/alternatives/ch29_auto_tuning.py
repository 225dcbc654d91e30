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
