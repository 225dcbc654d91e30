"""Chapter 25: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # index lists per expert instead of a sort; int32 counts; the result written back with index_copy
    "25.1": '''
e = gate_weight.shape[0]
probs = torch.softmax(x @ gate_weight.T, dim=-1)
p, choice = probs.max(dim=-1)
groups = [torch.nonzero(choice == j).flatten() for j in range(e)]
send = torch.tensor([len(g) for g in groups], dtype=torch.int32)
recv = torch.zeros_like(send)
comm.all_to_all(recv, send, group=group)
idx = torch.cat(groups)
rows = torch.zeros(int(recv.sum()), x.shape[1], dtype=x.dtype)
comm.all_to_all(rows, x.index_select(0, idx), recv.tolist(), send.tolist(), group=group)
back = torch.zeros_like(x)
comm.all_to_all(back, expert(rows), send.tolist(), recv.tolist(), group=group)
return torch.zeros_like(x).index_copy(0, idx, back * p[idx].unsqueeze(1))
''',
    # per expert, its tokens sorted by their draw in a Python loop; l_aux from bincount; index_copy back
    "25.2": '''
n, d = x.shape
e = gate_weight.shape[0]
gates = torch.softmax(x @ gate_weight.T, dim=-1)
choice = gates.argmax(dim=-1)
counts = torch.bincount(choice, minlength=e)
l_aux = e * torch.dot(gates.mean(0), counts.float() / n)
cap = max(-(-n * capacity_factor // e), 4)
cap = int(cap)
rows, kept = [], []
for j in range(e):
    mine = [t for t in range(n) if choice[t] == j]
    chosen = sorted(sorted(mine, key=lambda t: -float(draw[t, j]))[:cap])
    for slot, t in enumerate(chosen):
        rows.append(j * cap + slot)
        kept.append(t)
rows, kept = torch.tensor(rows, dtype=torch.long), torch.tensor(kept, dtype=torch.long)
buffer = torch.zeros(e * cap, d, dtype=x.dtype).index_copy(0, rows, x[kept])
back = all_to_all(expert(all_to_all(buffer, group)), group)
p = gates[kept, choice[kept]]
return torch.zeros_like(x).index_copy(0, kept, back[rows] * p.unsqueeze(1)), l_aux, counts
''',
}

WRONG = {
}

def ds_moe(keep_rule="draw", aux_after_drop=False, floor=4, counts_after_drop=False):
    """A 25.2 answer with one mistake switched on."""
    return f'''
n, d = x.shape
e = gate_weight.shape[0]
gates = torch.softmax(x @ gate_weight.T, dim=-1)
p, choice = gates.max(dim=-1)
chose = F.one_hot(choice, e)
cap = max(math.ceil(n / e * capacity_factor), {floor})
if "{keep_rule}" == "draw":
    best = torch.topk(chose * draw, min(cap, n), dim=0).indices
    keep = chose * torch.zeros_like(chose).scatter_(0, best, 1)
else:
    keep = chose * ((chose.cumsum(0) - 1) < cap)
counts = (keep if {counts_after_drop} else chose).sum(0)
l_aux = e * (gates.mean(0) * (keep if {aux_after_drop} else chose).float().mean(0)).sum()
slot = ((keep.cumsum(0) - 1) * keep).sum(-1)
kept = keep.sum(-1) > 0
rows = (choice * cap + slot)[kept]
buffer = x.new_zeros(e * cap, d).index_copy(0, rows, x[kept])
out = all_to_all(expert(all_to_all(buffer, group)), group)
y = x.new_zeros(n, d).index_add(0, kept.nonzero().squeeze(1), out[rows] * p[kept].unsqueeze(1))
return y, l_aux, counts
'''


# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the rows sent in token order with the per-expert counts as splits: the splits say how many rows go to each
    # rank but not which, so tokens reach the wrong experts (the output fails; the bytes are right)
    {"25.1": '''
e = gate_weight.shape[0]
p, choice = torch.softmax(x @ gate_weight.T, dim=-1).max(dim=-1)
send = torch.bincount(choice, minlength=e)
recv = torch.empty_like(send)
comm.all_to_all(recv, send, group=group)
rows = x.new_empty(int(recv.sum()), x.shape[1])
comm.all_to_all(rows, x.contiguous(), recv.tolist(), send.tolist(), group=group)
back = x.new_empty(x.shape)
comm.all_to_all(back, expert(rows).contiguous(), send.tolist(), recv.tolist(), group=group)
return back * p.unsqueeze(1)
'''},
    # fixed slots big enough never to drop (C = N): the right output, but no count exchange and E·N·d·4 bytes per
    # call, E times the real rows (the collectives check fails)
    {"25.1": '''
n, d = x.shape
e = gate_weight.shape[0]
p, choice = torch.softmax(x @ gate_weight.T, dim=-1).max(dim=-1)
onehot = torch.nn.functional.one_hot(choice, e)
slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1)
rows = choice * n + slot
buffer = x.new_zeros(e * n, d).index_copy(0, rows, x)
arrived = torch.empty_like(buffer)
comm.all_to_all(arrived, buffer, group=group)
out = torch.empty_like(buffer)
comm.all_to_all(out, expert(arrived), group=group)
return out[rows] * p.unsqueeze(1)
'''},
    # the gate probability forgotten in the combine: each token gets its expert's row unweighted
    {"25.1": '''
e = gate_weight.shape[0]
choice = (x @ gate_weight.T).argmax(dim=-1)
order = torch.argsort(choice, stable=True)
send = torch.bincount(choice, minlength=e)
recv = torch.empty_like(send)
comm.all_to_all(recv, send, group=group)
rows = x.new_empty(int(recv.sum()), x.shape[1])
comm.all_to_all(rows, x[order].contiguous(), recv.tolist(), send.tolist(), group=group)
back = x.new_empty(x.shape)
comm.all_to_all(back, expert(rows).contiguous(), send.tolist(), recv.tolist(), group=group)
y = torch.empty_like(x)
y[order] = back
return y
'''},
    # the token-order queue of this chapter's gate (DeepSpeed's use_rts=False): an overfull expert keeps its
    # first C tokens, not the C with the largest draw (the output and gradients fail on the ranks that drop)
    {"25.2": ds_moe(keep_rule="queue")},
    # the auxiliary loss from the tokens kept after the drop instead of every token's choice (l_aux fails)
    {"25.2": ds_moe(aux_after_drop=True)},
    # exp_counts counted after the drop (DeepSpeed counts the gating decisions before it)
    {"25.2": ds_moe(counts_after_drop=True)},
    # no min_capacity: C = ⌈12/4⌉ = 3 instead of 4, more tokens dropped and fewer bytes per all-to-all
    {"25.2": ds_moe(floor=0)},
    # the bypass: zero_ref's copy of DeepSpeed's gating called on the logits; it draws its own random numbers,
    # not the `draw` given, so it keeps other tokens where an expert overflows (output and gradients fail)
    {"25.2": '''
from zero_ref.ds.moe.layer import deepspeed_gating
n, d = x.shape
r, counts = deepspeed_gating(x @ gate_weight.T, 1, capacity_factor, 4)
e, c = gate_weight.shape[0], r.capacity
kept = r.kept[:, 0]
rows = r.slot[:, 0][kept]
buffer = x.new_zeros(e * c, d).index_copy(0, rows, x[kept])
out = all_to_all(expert(all_to_all(buffer, group)), group)
y = x.new_zeros(n, d).index_add(0, kept.nonzero().squeeze(1), out[rows] * r.weight[:, 0][kept].unsqueeze(1))
return y, r.aux_loss, counts
'''},
]
