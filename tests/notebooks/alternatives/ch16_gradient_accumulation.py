"""Chapter 16: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # fill the missing keys one after the other (a // b // c == a // (b * c)), return a list
    "16.1": '''
if tbs is None and mbs is None:
    raise ValueError("train_batch_size or train_micro_batch_size_per_gpu is needed")
if gas is None:
    gas = 1 if tbs is None or mbs is None else tbs // (mbs * dp)
if mbs is None:
    mbs = tbs // (dp * gas)
if tbs is None:
    tbs = mbs * gas * dp
if not (tbs > 0 and mbs > 0 and gas > 0) or tbs != mbs * gas * dp:
    raise ValueError("train_batch_size != micro × gas × dp")
return [tbs, mbs, gas]
''',
}

WRONG = {
    # stage 2 treated like stage 1: one reduce-scatter per bucket per optimizer step
    "16.2": '''
if stage == 0:
    return {"all_reduce": n_buckets}
return {"reduce_scatter": n_buckets, "all_gather": n_buckets, "all_reduce": 1}
''',
    # each micro-batch weighted by its share of the tokens, forgetting that backward divides by GAS
    "16.3": '''
total = sum(token_counts)
return [n / total for n in token_counts]
''',
}

# Task 16.4: the mean of the micro-batch losses in one backward, one all-reduce per parameter
RIGHT["16.4"] = '''
torch.stack([model(i, t)[1] for i, t in micro_batches]).mean().backward()
for p in model.parameters():
    comm.all_reduce(p.grad, group=group)
    p.grad /= comm.get_world_size(group)
optimizer.step()
optimizer.zero_grad(set_to_none=True)
'''
