"""Chapter 26: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the quadratic solved in closed form, then snapped to the grid of multiples (a float result)
    "26.2": '''
import math

def per_layer(s):
    sbh = s * hidden
    if recompute == "full":
        return 2 * sbh / (tp if sp else 1)
    scores = 5 * heads * s * s if recompute == "none" else 0
    return (34 * sbh + scores) / tp if sp else 10 * sbh + (24 * sbh + scores) / tp

# layers · (q·s² + l·s) ≤ budget, with q the score term and l the linear one per token
if recompute == "full":
    q, lin = 0.0, 2 * hidden / (tp if sp else 1)
else:
    q = 5 * heads / tp if recompute == "none" else 0.0
    lin = 34 * hidden / tp if sp else 10 * hidden + 24 * hidden / tp
c = budget_bytes / layers
s_max = c / lin if q == 0 else (-lin + math.sqrt(lin * lin + 4 * q * c)) / (2 * q)
s = float(multiple * math.floor(s_max / multiple))
while s > 0 and layers * per_layer(s) > budget_bytes:    # float rounding at the edge
    s -= multiple
while layers * per_layer(s + multiple) <= budget_bytes:
    s += multiple
return s
''',
    # the online softmax written out (running max, running sum, unnormalised accumulator); K and V sent apart
    "26.3": '''
import math
cp, r = dist.get_world_size(group), dist.get_rank(group)
ranks = dist.get_process_group_ranks(group)
n = q.shape[0]
mine = torch.tensor(zigzag_positions(n * cp, cp, r))
qh = q.permute(1, 2, 0, 3) / math.sqrt(q.shape[-1])
k_cur, v_cur = k.contiguous(), v.contiguous()
m = torch.full(qh.shape[:-1], float("-inf"), dtype=q.dtype)
l = torch.zeros_like(m)
acc = torch.zeros_like(qh)
for step in range(cp):
    if step < cp - 1:
        k_next, v_next = torch.empty_like(k_cur), torch.empty_like(v_cur)
        nxt, prv = ranks[(r + 1) % cp], ranks[(r - 1) % cp]
        handles = [comm.isend(k_cur, nxt, group), comm.isend(v_cur, nxt, group),
                   comm.irecv(k_next, prv, group), comm.irecv(v_next, prv, group)]
    theirs = torch.tensor(zigzag_positions(n * cp, cp, (r - step) % cp))
    scores = (qh @ k_cur.permute(1, 2, 3, 0)).masked_fill(theirs[None, :] > mine[:, None], float("-inf"))
    m_new = torch.maximum(m, scores.amax(-1))      # finite from step 0 on: every token sees itself
    p = torch.exp(scores - m_new.unsqueeze(-1))
    shrink = torch.exp(m - m_new)
    l = l * shrink + p.sum(-1)
    acc = acc * shrink.unsqueeze(-1) + p @ v_cur.permute(1, 2, 0, 3)
    m = m_new
    if step < cp - 1:
        for h in handles:
            h.wait()
        k_cur, v_cur = k_next, v_next
return (acc / l.unsqueeze(-1)).permute(2, 0, 1, 3)
''',
}

WRONG = {
    # the linear part counted as the 24·sbh that tensor parallelism splits, the replicated 10·sbh left out
    "26.1": '''
return 24 * hidden / (5 * heads)
''',
    # the all-to-all on the wrong dim: the (s/cp, b, cp, heads/cp, d) view sent as it is, so dim 0 (the tokens)
    # is split among the ranks instead of the head groups; shapes fit, values do not
    "26.4": '''
cp = dist.get_world_size(group)
s_local, b, heads, d = q.shape
if heads % cp:
    raise ValueError(f"Ulysses: heads = {heads} is not divisible by cp = {cp}")

def to_heads(x):
    return all_to_all(x.reshape(s_local, b, cp, heads // cp, d), group).reshape(cp * s_local, b, heads // cp, d)

def to_sequence(x):
    return all_to_all(x.reshape(cp * s_local, b, heads // cp, d), group).reshape(s_local, b, heads, d)

return to_sequence(causal_attention(to_heads(q), to_heads(k), to_heads(v)))
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # no divisibility check: right on 4 heads, but 5 heads over cp ranks fail deep inside a reshape with a
    # RuntimeError about a shape, not a ValueError naming heads and cp (the refusal check fails it)
    {"26.4": '''
cp = dist.get_world_size(group)
s_local, b, heads, d = q.shape

def to_heads(x):
    chunks = x.reshape(s_local, b, cp, heads // cp, d).permute(2, 0, 1, 3, 4)
    return all_to_all(chunks, group).reshape(cp * s_local, b, heads // cp, d)

def to_sequence(x):
    chunks = x.reshape(cp, s_local, b, heads // cp, d)
    return all_to_all(chunks, group).permute(1, 2, 0, 3, 4).reshape(s_local, b, heads, d)

return to_sequence(causal_attention(to_heads(q), to_heads(k), to_heads(v)))
'''},
]
