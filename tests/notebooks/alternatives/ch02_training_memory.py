"""Chapter 2: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # bytes per parameter from the dtypes of the recipe, as floats
    "2.1": '''
weight = 4.0 if recipe == "fp32" else 2.0
grad = 4.0 if recipe in ("fp32", "bf16_fp32_grads") else 2.0
optimizer = 8.0 if recipe == "fp32" else 12.0          # m, v (+ the fp32 master copy)
return dict(params=weight * num_params, grads=grad * num_params, optimizer=optimizer * num_params,
            total=(weight + grad + optimizer) * num_params)
''',
    # every saved tensor kept in a list first; the storages are told apart afterwards, by address
    "2.2": '''
saved = []
with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
    y = module(x)
params = set(p.untyped_storage().data_ptr() for p in module.parameters())
sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
return sum(n for ptr, n in sizes.items() if ptr not in params)
''',
}

WRONG = {
    # "16 bytes per parameter" for every recipe: wrong for Megatron's 18-byte layout
    "2.3": '''
return int(gpu_bytes // 16)
''',
}
