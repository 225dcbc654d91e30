"""Chapter 12: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # what each stage divides, as a table of divisors, and the first stage that fits found with next()
    "12.1": '''
divides = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
held = {s: sum(b / world_size if cat in divides[s] else b for cat, b in stage0_bytes.items()) for s in divides}
return next((s for s in sorted(held) if held[s] <= budget), None)
''',
    # rank 0 draws the flags and broadcasts them: every rank uses rank 0's draw
    "12.4": '''
flags = torch.tensor([float(k) for k in planted_keep(step, 0, world_size, seed)]) if rank == 0 \
    else torch.zeros(LCFG.n_layers)
comm.broadcast(flags, src=0)
return [bool(f) for f in flags.tolist()]
''',
}

WRONG = {
    # blames the rank that is about to gather the skipped block (the one left waiting), not the one that skipped it
    "12.3": '''
words = message.split("'")
first_rank, first_unit = int(words[0].split("rank ")[-1].split()[0]), words[1]
second_rank, second_unit = int(words[2].split("rank ")[-1].split()[0]), words[3]
order = [n for n, _ in model.named_modules()]
rank, unit = min((first_rank, first_unit), (second_rank, second_unit), key=lambda ru: order.index(ru[1]))
return rank, ".".join(unit.split(".")[:2])
''',
    # every module whose output is bad, then the first in registration order (a parent before its child)
    "12.2": '''
bad = set()
handles = []
for name, module in model.named_modules():
    def hook(module, args, output, name=name):
        outputs = output if isinstance(output, tuple) else (output,)
        if any(torch.is_tensor(t) and not torch.isfinite(t).all() for t in outputs):
            bad.add(name)
    if name:
        handles.append(module.register_forward_hook(hook))
try:
    model(*inputs)
finally:
    for h in handles:
        h.remove()
return next((n for n, _ in model.named_modules() if n in bad), None)
''',
}
