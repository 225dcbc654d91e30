"""Chapter 26: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the online softmax written out (running max, running sum, unnormalised accumulator); K and V sent apart
    "26.1": '''
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
    # the block backward written out (P = exp(S − lse), dS = P ∘ (dP − rowsum(dO ∘ O))); K, V, dK, dV sent apart
    "26.2": '''
import math
cp, r = dist.get_world_size(group), dist.get_rank(group)
ranks = dist.get_process_group_ranks(group)
n = q.shape[0]
mine = torch.tensor(zigzag_positions(n * cp, cp, r))
scale = 1 / math.sqrt(q.shape[-1])
qh, oh, doh = (t.permute(1, 2, 0, 3) for t in (q, out, dout))
delta = (doh * oh).sum(-1, keepdim=True)
k_cur, v_cur = k.permute(1, 2, 0, 3).contiguous(), v.permute(1, 2, 0, 3).contiguous()
dk_acc, dv_acc, dq = torch.zeros_like(k_cur), torch.zeros_like(v_cur), torch.zeros_like(qh)

def pass_on(*ts):
    got = [torch.empty_like(t) for t in ts]
    handles = ([comm.isend(t.contiguous(), ranks[(r + 1) % cp], group) for t in ts]
               + [comm.irecv(g, ranks[(r - 1) % cp], group) for g in got])
    for h in handles:
        h.wait()
    return got

for step in range(cp):
    theirs = torch.tensor(zigzag_positions(n * cp, cp, (r - step) % cp))
    s = (qh @ k_cur.transpose(-1, -2) * scale).masked_fill(theirs[None, :] > mine[:, None], float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    ds = p * (doh @ v_cur.transpose(-1, -2) - delta)
    dq = dq + ds @ k_cur * scale
    dk_acc, dv_acc = pass_on(dk_acc + ds.transpose(-1, -2) @ qh * scale, dv_acc + p.transpose(-1, -2) @ doh)
    if step < cp - 1:
        k_cur, v_cur = pass_on(k_cur, v_cur)
return dq.permute(2, 0, 1, 3), dk_acc.permute(2, 0, 1, 3), dv_acc.permute(2, 0, 1, 3)
''',
    # selective recomputation with FlashAttention: nothing left for it to redo, the same step as none
    "26.4": '''
return sim.Plan(tp=8, sequence_parallel=True, recompute="selective", attention="flash", zero_stage=1)
''',
}

WRONG = {
    # the all-to-all on the wrong dim: the (s/cp, b, cp, heads/cp, d) view sent as it is, so dim 0 (the tokens)
    # is split among the ranks instead of the head groups; shapes fit, values do not
    "26.3": '''
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
    # each block's gradient kept where it was computed: a rank returns the sum of its own queries' shares of
    # every block that passed by, not its own block's gradient from every rank's queries
    {"26.2": '''
cp, r = dist.get_world_size(group), dist.get_rank(group)
ranks = dist.get_process_group_ranks(group)
pos = [torch.tensor(zigzag_positions(q.shape[0] * cp, cp, j)) for j in range(cp)]
qh, oh, doh = (t.permute(1, 2, 0, 3) for t in (q, out, dout))
kv = torch.stack([k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)]).contiguous()
dq, dkv = torch.zeros_like(qh), torch.zeros_like(kv)
for step in range(cp):
    owner = (r - step) % cp
    dq_b, dk_b, dv_b = block_backward(qh, kv[0], kv[1], oh, lse, doh, pos[owner][None, :] <= pos[r][:, None])
    dq += dq_b
    dkv += torch.stack([dk_b, dv_b])
    if step < cp - 1:
        incoming = torch.empty_like(kv)
        for h in (comm.isend(kv, ranks[(r + 1) % cp], group), comm.irecv(incoming, ranks[(r - 1) % cp], group)):
            h.wait()
        kv = incoming
return tuple(t.permute(2, 0, 1, 3) for t in (dq, dkv[0], dkv[1]))
'''},
    # each block's softmax normalised on its own (its own log-sum-exp from block_forward) instead of the final
    # lse: every block's probabilities sum to 1, so the gradients are wrong although the bytes are right
    {"26.2": '''
cp, r = dist.get_world_size(group), dist.get_rank(group)
ranks = dist.get_process_group_ranks(group)
pos = [torch.tensor(zigzag_positions(q.shape[0] * cp, cp, j)) for j in range(cp)]
qh, doh = q.permute(1, 2, 0, 3), dout.permute(1, 2, 0, 3)
kv = torch.stack([k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)]).contiguous()

def shift(t):
    incoming = torch.empty_like(t)
    for h in (comm.isend(t, ranks[(r + 1) % cp], group), comm.irecv(incoming, ranks[(r - 1) % cp], group)):
        h.wait()
    return incoming

dq, dkv = torch.zeros_like(qh), torch.zeros_like(kv)
for step in range(cp):
    mask = pos[(r - step) % cp][None, :] <= pos[r][:, None]
    out_b, lse_b = block_forward(qh, kv[0], kv[1], mask)
    dq_b, dk_b, dv_b = block_backward(qh, kv[0], kv[1], out_b, torch.nan_to_num(lse_b, neginf=0.0), doh, mask)
    dq += dq_b
    dkv = shift(dkv + torch.stack([dk_b, dv_b]))
    if step < cp - 1:
        kv = shift(kv)
return tuple(t.permute(2, 0, 1, 3) for t in (dq, dkv[0], dkv[1]))
'''},
    # no divisibility check: right on 4 heads, but 5 heads over cp ranks fail deep inside a reshape with a
    # RuntimeError about a shape, not a ValueError naming heads and cp (the refusal check fails it)
    {"26.3": '''
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
    # not a ring: each rank sends its own K/V block straight to every other rank and receives theirs (the
    # same cp − 1 blocks, the same output), so the sends go to every peer instead of rank r + 1 only
    {"26.1": '''
cp, r = dist.get_world_size(group), dist.get_rank(group)
ranks = dist.get_process_group_ranks(group)
pos = [torch.tensor(zigzag_positions(q.shape[0] * cp, cp, j)) for j in range(cp)]
qh = q.permute(1, 2, 0, 3)
mine = torch.stack([k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)]).contiguous()
blocks = {j: torch.empty_like(mine) for j in range(cp) if j != r}
handles = [comm.isend(mine, ranks[j], group) for j in blocks] + [comm.irecv(blocks[j], ranks[j], group) for j in blocks]
for h in handles:
    h.wait()
blocks[r] = mine
out, lse = block_forward(qh, mine[0], mine[1], pos[r][None, :] <= pos[r][:, None])
for j in blocks:
    if j != r:
        out, lse = merge(out, lse, *block_forward(qh, blocks[j][0], blocks[j][1], pos[j][None, :] <= pos[r][:, None]))
return out.permute(2, 0, 1, 3)
'''},
    # the bypass: the K/V blocks passed round the ring to rank r + 1 (the ring's bytes, the ring's peers), but
    # every block kept and full attention run once all have arrived: right output, but a rank holds cp blocks,
    # so what it holds grows from cp = 2 to cp = 4 and the memory check fails it
    {"26.1": '''
cp, r = dist.get_world_size(group), dist.get_rank(group)
ranks = dist.get_process_group_ranks(group)
pos = [torch.tensor(zigzag_positions(q.shape[0] * cp, cp, j)) for j in range(cp)]
kv = torch.stack([k, v]).contiguous()
blocks = {r: kv}
for step in range(1, cp):
    incoming = torch.empty_like(kv)
    for h in (comm.isend(kv, ranks[(r + 1) % cp], group), comm.irecv(incoming, ranks[(r - 1) % cp], group)):
        h.wait()
    kv = blocks[(r - step) % cp] = incoming
keys = torch.cat([blocks[j][0] for j in range(cp)]).permute(1, 2, 0, 3)
values = torch.cat([blocks[j][1] for j in range(cp)]).permute(1, 2, 0, 3)
everyone = torch.cat(pos)
out, _ = block_forward(q.permute(1, 2, 0, 3), keys, values, everyone[None, :] <= pos[r][:, None])
return out.permute(2, 0, 1, 3)
'''},
    # the same bypass in backward: every K/V block collected first, every share computed, then the dK/dV
    # accumulators sent round (the ring's bytes, right gradients), holding cp blocks at once
    {"26.2": '''
cp, r = dist.get_world_size(group), dist.get_rank(group)
ranks = dist.get_process_group_ranks(group)
pos = [torch.tensor(zigzag_positions(q.shape[0] * cp, cp, j)) for j in range(cp)]
qh, oh, doh = (t.permute(1, 2, 0, 3) for t in (q, out, dout))
kv = torch.stack([k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)]).contiguous()

def shift(t):
    incoming = torch.empty_like(t)
    for h in (comm.isend(t, ranks[(r + 1) % cp], group), comm.irecv(incoming, ranks[(r - 1) % cp], group)):
        h.wait()
    return incoming

blocks = {r: kv}
for step in range(1, cp):
    kv = blocks[(r - step) % cp] = shift(kv)
dq, shares = torch.zeros_like(qh), {}
for j, b in blocks.items():
    dq_b, dk_b, dv_b = block_backward(qh, b[0], b[1], oh, lse, doh, pos[j][None, :] <= pos[r][:, None])
    dq += dq_b
    shares[j] = torch.stack([dk_b, dv_b])
dkv = torch.zeros_like(kv)
for step in range(cp):
    dkv = shift(dkv + shares[(r - step) % cp])
return tuple(t.permute(2, 0, 1, 3) for t in (dq, dkv[0], dkv[1]))
'''},
    # less tensor parallelism, so full recomputation to fit: tp 2 fits at 32k with FlashAttention, but the
    # recomputed forward costs more than TP 8's collectives
    {"26.4": '''
return sim.Plan(tp=2, dp=4, zero_stage=1, sequence_parallel=True, recompute="full", attention="flash")
'''},
    # FlashAttention without SP: the 10sbh that TP replicates, at 32k tokens, no longer fits in 80 GB
    {"26.4": '''
return sim.Plan(tp=8, dp=1, zero_stage=1, sequence_parallel=False, recompute="none", attention="flash")
'''},
    # the section's answer before FlashAttention: TP 8 + SP with selective recomputation and eager attention fits
    # at 32k, but recomputes the scores and runs them as unfused kernels: about half the best MFU
    {"26.4": '''
return sim.Plan(tp=8, dp=1, zero_stage=1, sequence_parallel=True, recompute="selective", attention="eager")
'''},
]
