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
}

WRONG = {
    # the 16-bit copy of the parameters forgotten: it is written in the same pass
    "14.2": '''
size = {"fp32": 4, "bf16": 2, "fp16": 2}
return 4 + size[grads] + 4 + 4, 4 + 4 + 4
''',
}
