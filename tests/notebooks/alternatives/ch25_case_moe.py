"""Chapter 25: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # vectorised: a running count over the one-hot matrix of all first choices, then all second choices;
    # pairs as lists
    "25.1": '''
choices = torch.tensor(list(first) + list(second))
onehot = torch.nn.functional.one_hot(choices, num_experts)
position = ((onehot.cumsum(0) - 1) * onehot).sum(1).view(2, len(first))
slots = [[int(p) if p < capacity else None for p in row] for row in position.tolist()]
return [[a, b] for a, b in zip(*slots)]
''',
}

WRONG = {
    # the combine forgets the gate weight: each kept token gets its expert's row unweighted (and the gate no gradient)
    "25.3": '''
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
''',
    # only the forward's dispatch and combine counted: the backward's two all-to-alls forgotten
    "25.2": '''
cap = math.ceil(k * tokens * capacity_factor / num_experts)
payload = 2 * moe_layers * num_experts * cap * d_model * element_size
return payload, payload * (ep - 1) / ep
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # capacity ignored: every expert's chunk sized for all N tokens, none dropped; the tokens the reference drops
    # get an output, and each all-to-all sends E·N·d·4 bytes instead of E·C·d·4 (output, dropped and bytes fail)
    {"25.3": '''
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
]
