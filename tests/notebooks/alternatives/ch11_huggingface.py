"""Chapter 11: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # one parameter at a time, by its full name: a tied weight is gathered twice, and never more than one
    # unit is gathered beside the persistent ones
    "11.1": '''
import torch.distributed as dist
state = {}
for name, p in model.named_parameters(remove_duplicate=False):
    with zero3.GatheredParameters(p):
        state[name] = p.data.cpu().clone()
return state if dist.get_rank() == 0 else None
''',
}

WRONG = {
    # a shallow copy: the nested "optimizer" section is the caller's, filled in place
    "11.2": '''
config = dict(config)
rules = [
    ("train_micro_batch_size_per_gpu", args.per_device_train_batch_size, "per_device_train_batch_size"),
    ("gradient_accumulation_steps", args.gradient_accumulation_steps, "gradient_accumulation_steps"),
    ("train_batch_size", args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps,
     "train_batch_size (calculated)"),
    ("gradient_clipping", args.max_grad_norm, "max_grad_norm"),
    ("optimizer.params.lr", args.learning_rate, "learning_rate"),
    ("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1+adam_beta2"),
    ("optimizer.params.eps", args.adam_epsilon, "adam_epsilon"),
    ("optimizer.params.weight_decay", args.weight_decay, "weight_decay"),
]
mismatches = []
for key, value, name in rules:
    *path, last = key.split(".")
    node = config
    for part in path:
        node = node.get(part)
        if node is None:
            break
    if node is None:
        continue
    if node.get(last) == "auto":
        node[last] = value
    elif node.get(last) is not None and node[last] != value:
        mismatches.append(f"- ds {key}={node[last]} vs hf {name}={value}")
if mismatches:
    raise ValueError("mismatches:\\n" + "\\n".join(mismatches))
return config
''',
}

# Task 11.3: the model's own loss with num_items_in_batch, the global count as an int64 tensor, one flat all-reduce
RIGHT["11.3"] = '''
import torch
n = torch.tensor([int((labels[:, 1:] != -100).sum())])
comm.all_reduce(n, group=group)
world = comm.get_world_size(group)
loss = model(input_ids=ids, labels=labels, num_items_in_batch=n.item()).loss
loss.mul(world).backward()
params = [p for p in model.parameters() if p.grad is not None]
flat = torch.cat([p.grad.flatten() for p in params])
comm.all_reduce(flat, group=group)
flat /= world
offset = 0
for p in params:
    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
    offset += p.numel()
return float(loss)
'''

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the whole model gathered at once (or module by module with recurse=True, whose root module is the whole
    # model): right values, and the memory ZeRO-3 exists to save
    {"11.1": '''
with zero3.GatheredParameters(list(model.parameters())):
    state = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
return state if torch.distributed.get_rank() == 0 else None
'''},
    # the copy kept on every rank: N full copies of the model, where rank 0's is the one saved
    {"11.1": '''
state = {}
for prefix, module in model.named_modules():
    own = list(module.named_parameters(recurse=False))
    with zero3.GatheredParameters([p for _, p in own]):
        for name, p in own:
            state[f"{prefix}.{name}" if prefix else name] = p.detach().clone()
return state
'''},
    # the targets counted before the shift: each row's first label, which no token predicts, counted too
    # (rank 1's rows are mostly padding, so its share of the count is off most): shares and gradients fail
    {"11.3": '''
count = (labels != -100).sum().to(torch.float32)
comm.all_reduce(count, group=group)
logits = model(input_ids=ids).logits[:, :-1]
share = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100,
                        reduction="sum") / count
world = comm.get_world_size(group)
(share * world).backward()
for p in model.parameters():
    if p.grad is not None:
        comm.all_reduce(p.grad, group=group)
        p.grad /= world
return share.item()
'''},
    # each rank's own mean loss, averaged over the ranks: a mean of means, which weighs rank 1's few targets as
    # much as rank 0's many (shares and gradients fail)
    {"11.3": '''
loss = model(input_ids=ids, labels=labels).loss
loss.backward()
world = comm.get_world_size(group)
for p in model.parameters():
    if p.grad is not None:
        comm.all_reduce(p.grad, group=group)
        p.grad /= world
return loss.item() / world
'''},
]
