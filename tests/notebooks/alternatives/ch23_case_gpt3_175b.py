"""Chapter 23: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # Korthikanti's closed forms written out in floats instead of zero_ref.memory's exact counts:
    # sbh·34/t kept per layer with SP + selective recomputation, 5as²b/t for the recomputed core
    "23.1": '''
p, m, v = plan.pp, plan.num_microbatches, plan.virtual
s, b, h, a, t = model.seq, plan.micro_batch_size, model.hidden, model.heads, plan.tp
chunks = min(sim.warmup_count(plan.schedule, p, m, stage, v) + 1, v * m)
kept_per_layer = 34.0 * s * b * h / t
recomputed_core = 5.0 * a * s * s * b / t
return chunks * (model.layers / (p * v)) * kept_per_layer + recomputed_core
''',
}

WRONG = {
    # steps not rounded up: the last, partial step of the token budget is never paid for
    "23.2": '''
def days_from_steps(tokens, global_batch, seq, step_time):
    return tokens / (global_batch * seq) * step_time / 86400


def days_from_flops(n_params, tokens, gpus, tflops_per_gpu):
    return 6 * n_params * tokens / (gpus * tflops_per_gpu * 1e12) / 86400
''',
}
