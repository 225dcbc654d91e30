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
    # a Python loop fills the slots; the rows written back with index_copy
    "25.2": '''
n, d = x.shape
e = gate_weight.shape[0]
p, choice = torch.softmax(x @ gate_weight.T, dim=-1).max(dim=-1)
cap = math.ceil(n * capacity_factor / e)
filled, rows, kept = [0] * e, [], []
for t, c in enumerate(choice.tolist()):
    if filled[c] < cap:
        rows.append(c * cap + filled[c])
        kept.append(t)
    filled[c] += 1
rows, kept = torch.tensor(rows, dtype=torch.long), torch.tensor(kept, dtype=torch.long)
buffer = torch.zeros(e * cap, d, dtype=x.dtype).index_copy(0, rows, x[kept])
back = all_to_all(expert(all_to_all(buffer, group)), group)
return torch.zeros_like(x).index_copy(0, kept, back[rows] * p[kept].unsqueeze(1)), n - len(kept)
''',
}

WRONG = {
}

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
    # capacity ignored: every expert's chunk sized for all N tokens, none dropped; the tokens the reference drops
    # get an output, and each all-to-all sends E·N·d·4 bytes instead of E·C·d·4 (output, dropped and bytes fail)
    {"25.2": '''
n, d = x.shape
e = gate_weight.shape[0]
p, choice = torch.softmax(x @ gate_weight.T, dim=-1).max(dim=-1)
onehot = F.one_hot(choice, e)
slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1)
rows = choice * n + slot
buffer = x.new_zeros(e * n, d).index_copy(0, rows, x)
out = all_to_all(expert(all_to_all(buffer, group)), group)
y = out[rows] * p.unsqueeze(1)
return y, 0
'''},
    # the capacity rounded down: ⌊18/4⌋ = 4 slots instead of ⌈18/4⌉ = 5, more tokens dropped, fewer bytes
    {"25.2": '''
n, d = x.shape
e = gate_weight.shape[0]
p, choice = torch.softmax(x @ gate_weight.T, dim=-1).max(dim=-1)
cap = int(n * capacity_factor / e)
onehot = F.one_hot(choice, e)
slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1)
kept = slot < cap
rows = (choice * cap + slot)[kept]
buffer = x.new_zeros(e * cap, d).index_copy(0, rows, x[kept])
out = all_to_all(expert(all_to_all(buffer, group)), group)
y = x.new_zeros(n, d).index_add(0, kept.nonzero().squeeze(1), out[rows] * p[kept].unsqueeze(1))
return y, int((~kept).sum())
'''},
    # the capacity rounded to the nearest: round(4.5) = 4 (Python rounds halves to even), the same too few slots
    {"25.2": '''
n, d = x.shape
e = gate_weight.shape[0]
p, choice = torch.softmax(x @ gate_weight.T, dim=-1).max(dim=-1)
cap = round(n * capacity_factor / e)
onehot = F.one_hot(choice, e)
slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1)
kept = slot < cap
rows = (choice * cap + slot)[kept]
buffer = x.new_zeros(e * cap, d).index_copy(0, rows, x[kept])
out = all_to_all(expert(all_to_all(buffer, group)), group)
y = x.new_zeros(n, d).index_add(0, kept.nonzero().squeeze(1), out[rows] * p[kept].unsqueeze(1))
return y, int((~kept).sum())
'''},
    # the combine forgets the gate weight: each kept token gets its expert's row unweighted (and the gate no gradient)
    {"25.2": '''
n, d = x.shape
e = gate_weight.shape[0]
p, choice = torch.softmax(x @ gate_weight.T, dim=-1).max(dim=-1)
cap = math.ceil(n * capacity_factor / e)
onehot = F.one_hot(choice, e)
slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1)
kept = slot < cap
rows = (choice * cap + slot)[kept]
buffer = x.new_zeros(e * cap, d).index_copy(0, rows, x[kept])
out = all_to_all(expert(all_to_all(buffer, group)), group)
y = x.new_zeros(n, d).index_add(0, kept.nonzero().squeeze(1), out[rows])
return y, int((~kept).sum())
'''},
]
