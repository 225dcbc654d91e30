"""Chapter 16: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG, MORE_WRONG
must fail)."""

RIGHT = {
    # walk the accumulation steps instead of the micro-batch sizes, keep every candidate, take the min
    "16.1": '''
groups = tp * pp
if world % groups != 0:
    raise ValueError("no rank grid")
dp = world // groups
per_rank = global_batch / dp
candidates = []
for gas in range(1, global_batch + 1):
    micro = per_rank / gas
    if micro == int(micro) and 1 <= micro <= max_micro:
        micro = int(micro)
        candidates.append(((gas + pp - 1) * (t_fixed + micro * t_sample), micro, gas))
if not candidates:
    raise ValueError("no valid layout")
_, micro, gas = min(candidates)
return micro, gas
''',
}

# Task 16.2: every rank's counts gathered (all_gather), the weights as n / (N / (gas · dp))
RIGHT["16.2"] = '''
world = comm.get_world_size(group)
mine = torch.tensor([float(sum(token_counts))])
everyone = torch.empty(world)
comm.all_gather(everyone, mine, group=group)
per_slot = everyone.sum().item() / (gas * world)
return [n / per_slot for n in token_counts]
'''

# Task 16.3: each micro-batch's backward unscaled, the GAS and the ranks divided out of the gradients afterwards
RIGHT["16.3"] = '''
for idx, targets in micro_batches:
    _, loss = model(idx, targets)
    loss.backward()
scale = 1.0 / (len(micro_batches) * comm.get_world_size(group))
for p in model.parameters():
    if p.grad is not None:
        comm.all_reduce(p.grad, group=group)
        p.grad.mul_(scale)
optimizer.step()
optimizer.zero_grad(set_to_none=True)
'''

_CHOOSE = '''
if world % (tp * pp):
    raise ValueError("no rank grid")
dp = {dp}
best = None
for micro in range(1, {max_micro} + 1):
    if global_batch % (micro * dp):
        continue
    gas = global_batch // (micro * dp)
    time = {time}
    if best is None or time < best[0]:
        best = (time, micro, gas)
if best is None:
    raise ValueError("no layout")
return best[1], best[2]
'''
_RIGHT = dict(dp="world // (tp * pp)", max_micro="max_micro", time="(gas + pp - 1) * (t_fixed + micro * t_sample)")

MORE_WRONG = [
    # dp taken to be the world size: the TP and PP ranks counted as data-parallel replicas
    {"16.1": _CHOOSE.format(**{**_RIGHT, "dp": "world"}),
     # the summed gradients never divided by the number of ranks
     "16.3": '''
for idx, targets in micro_batches:
    (model(idx, targets)[1] / len(micro_batches)).backward()
for p in model.parameters():
    comm.all_reduce(p.grad, group=group)
optimizer.step()
optimizer.zero_grad()
'''},
    # the pipeline bubble left out: gas slots instead of gas + pp − 1
    {"16.1": _CHOOSE.format(**{**_RIGHT, "time": "gas * (t_fixed + micro * t_sample)"}),
     # the loss not divided by GAS: the gradient of the sum of the micro-batch means
     "16.3": '''
for idx, targets in micro_batches:
    model(idx, targets)[1].backward()
for p in model.parameters():
    comm.all_reduce(p.grad, group=group)
    p.grad /= comm.get_world_size(group)
optimizer.step()
optimizer.zero_grad()
'''},
    # the memory limit ignored: any micro-batch that divides the batch
    {"16.1": _CHOOSE.format(**{**_RIGHT, "max_micro": "global_batch"})},
    # 16.2: each rank normalizes by its own tokens (no communication): right only when every rank holds as many;
    # 16.3: no accumulation, one backward of the stacked mean of all micro-batches (all activations alive at once)
    {"16.2": '''
total = sum(token_counts)
return [gas * n / total for n in token_counts]
''',
     "16.3": '''
torch.stack([model(i, t)[1] for i, t in micro_batches]).mean().backward()
for p in model.parameters():
    comm.all_reduce(p.grad, group=group)
    p.grad /= comm.get_world_size(group)
optimizer.step()
optimizer.zero_grad(set_to_none=True)
'''},
    # the global token count and GAS, but not the average over the ranks the stage takes afterwards
    {"16.2": '''
total = torch.tensor([float(sum(token_counts))])
comm.all_reduce(total, group=group)
return [gas * n / total.item() for n in token_counts]
'''},
    # the global token count, but forgetting that backward divides by GAS
    {"16.2": '''
total = torch.tensor([float(sum(token_counts))])
comm.all_reduce(total, group=group)
return [comm.get_world_size(group) * n / total.item() for n in token_counts]
'''},
]
