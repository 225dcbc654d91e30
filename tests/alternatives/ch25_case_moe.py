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
    # only the forward's dispatch and combine counted: the backward's two all-to-alls forgotten
    "25.2": '''
cap = math.ceil(k * tokens * capacity_factor / num_experts)
payload = 2 * moe_layers * num_experts * cap * d_model * element_size
return payload, payload * (ep - 1) / ep
''',
}
