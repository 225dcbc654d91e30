"""Chapter 14: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the textbook form: lerp-style first moment, bias-corrected m̂ and v̂, one sqrt of v̂
    "14.1": '''
bc1 = 1 - beta1 ** step
bc2 = 1 - beta2 ** step
decay = 1 - lr * weight_decay
for i in range(p.size):
    gi = g[i]
    m[i] += (1 - beta1) * (gi - m[i])
    v[i] = beta2 * v[i] + (1 - beta2) * gi * gi
    m_hat = m[i] / bc1
    v_hat = v[i] / bc2
    p[i] = p[i] * decay - lr * m_hat / (math.sqrt(v_hat) + eps)
''',
    # the table from a torch int64 tensor, the constants' step kept in a closure over a dict
    "14.2": '''
table = torch.tensor([[p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr()]
                      for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs)], dtype=torch.int64).numpy()
counts = torch.tensor([p.numel() for p in params], dtype=torch.int64).numpy()
kept = {"table": table, "counts": counts}

def step_all(step, cfg):
    k = AdamConstants.from_config(step, cfg)
    step_multi(kept["table"], kept["counts"], k)

return step_all
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # ε inside the square root: invisible with gradients of order 1, a factor ~100 in the step at 1e-6
    {"14.1": '''
step_size = lr / (1 - beta1**step)
bc2 = 1 - beta2**step
for i in range(p.size):
    p[i] *= 1 - lr * weight_decay
    m[i] = beta1 * m[i] + (1 - beta1) * g[i]
    v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i]
    p[i] -= step_size * m[i] / math.sqrt(v[i] / bc2 + eps)
''',
     # the table rebuilt on every step: right numbers, but the host work grows with the number of tensors
     "14.2": '''
def step_all(step, cfg):
    rows = zip(params, grads, exp_avgs, exp_avg_sqs)
    addresses = np.array([[t.data_ptr() for t in row] for row in rows], dtype=np.int64)
    sizes = np.array([p.numel() for p in params], dtype=np.int64)
    step_multi(addresses, sizes, AdamConstants.from_config(step, cfg))

return step_all
'''},
    # decay applied after the update (to the updated parameter): off by lr·wd·update per step
    {"14.1": '''
step_size = lr / (1 - beta1**step)
bc2_sqrt = math.sqrt(1 - beta2**step)
for i in range(p.size):
    m[i] = beta1 * m[i] + (1 - beta1) * g[i]
    v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i]
    p[i] -= step_size * m[i] / (math.sqrt(v[i]) / bc2_sqrt + eps)
    p[i] *= 1 - lr * weight_decay
''',
     # the columns in the wrong order (param, exp_avg, exp_avg_sq, grad): the kernel steps the wrong arrays
     "14.2": '''
rows = zip(params, exp_avgs, exp_avg_sqs, grads)
addresses = np.array([[t.data_ptr() for t in row] for row in rows], dtype=np.int64)
sizes = np.array([p.numel() for p in params], dtype=np.int64)

def step_all(step, cfg):
    step_multi(addresses, sizes, AdamConstants.from_config(step, cfg))

return step_all
'''},
    # ε added to the uncorrected √v (the Adam paper's algorithm 1 form): differs once ε matters
    {"14.1": '''
step_size = lr / (1 - beta1**step)
bc2_sqrt = math.sqrt(1 - beta2**step)
for i in range(p.size):
    p[i] *= 1 - lr * weight_decay
    m[i] = beta1 * m[i] + (1 - beta1) * g[i]
    v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i]
    p[i] -= step_size * bc2_sqrt * m[i] / (math.sqrt(v[i]) + eps)
''',
     # one kernel call per tensor: right numbers, 100 calls per step
     "14.2": '''
tables = [(np.array([[p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr()]], dtype=np.int64),
           np.array([p.numel()], dtype=np.int64)) for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs)]

def step_all(step, cfg):
    k = AdamConstants.from_config(step, cfg)
    for addresses, sizes in tables:
        step_multi(addresses, sizes, k)

return step_all
'''},
]
