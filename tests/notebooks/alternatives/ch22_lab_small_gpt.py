"""Chapter 22: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # rows dealt round-robin to the replicas; every tensor-parallel rank of the last stage adds its share
    "22.2": '''
dp, tp = parts.topology.dp, parts.topology.tp
rows = torch.arange(parts.d, idx.shape[0], dp)
stats = parts.pipeline.train_step(list(zip(idx[rows].chunk(parts.microbatches), targets[rows].chunk(parts.microbatches))),
                                  optimizer=parts.optimizer)
parts.optimizer.step()
share = torch.zeros(1, dtype=torch.float64)
if stats.loss is not None:
    share += stats.loss / (dp * tp)
comm.all_reduce(share)
return stats, float(share)
''',
    # one expression, in float bytes: the activations forward, their gradients back, the tied embedding twice
    "22.1": '''
if pp == 1:
    return 0.0
act = 4.0 * micro * seq * hidden
sends = m * act * ((stage < pp - 1) + (stage > 0))
tied = 4.0 * embedding_shard if pp > 1 and stage in (0, pp - 1) else 0.0
return 32.0 + sends + tied
''',
    # other grids (8 ranks and 4), the parameters counted tensor by tensor, payload times the ring factor
    "22.3": '''
GRIDS = [(1, 2, 4), (4, 1, 1)]


def predict_sends(tp, pp, dp, stage, cfg, global_batch, m):
    V, T, d = cfg.vocab_size, cfg.seq_len, cfg.d_model
    ring_ar = lambda n: 2 * (n - 1) / n
    ring_half = lambda n: (n - 1) / n
    blocks = cfg.n_layers // pp
    is_first, is_last = stage == 0, stage == pp - 1
    hidden = 4 * (global_batch // dp // m) * T * d
    tokens = 4 * (global_batch // dp // m) * T
    tp_calls = m * (4 * blocks + is_first + is_last)
    tp_sent = ring_ar(tp) * (tp_calls * hidden + (3 * m * tokens if is_last else 0))
    pp_sent = 0
    if pp > 1:
        pp_sent = 32 + m * hidden * (int(not is_first) + int(not is_last))
        if is_first or is_last:
            pp_sent += 4 * V * d // tp
    split = [3 * d * d, 3 * d, d * d, 4 * d * d, 4 * d, 4 * d * d]   # qkv w, b; proj w; fc1 w, b; fc2 w
    kept = [d, d, d, d, d, d]                                         # proj b, fc2 b, ln1 w, b, ln2 w, b
    n = blocks * (sum(split) // tp + sum(kept))
    if is_first:
        n += V * d // tp + T * d
    if is_last:
        n += 2 * d
        if pp > 1:
            n += V * d // tp
    while n % dp:
        n += 1
    dp_sent = 2 * ring_half(dp) * 4 * n + ring_ar(dp) * 2 * 8
    return dict(tp=tp_sent, pp=pp_sent, dp=dp_sent)
''',
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the simulator's even split: every rank holds Ψ / (tp × pp) parameters (no replicated LayerNorms, biases,
    # position table; the tied embedding counted once)
    {"22.3": '''
GRIDS = [(2, 1, 2), (1, 4, 1)]


def predict_sends(tp, pp, dp, stage, cfg, global_batch, m):
    V, T, d, L = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers
    micro = global_batch // (dp * m)
    act = micro * T * d * 4
    first, last, blocks = stage == 0, stage == pp - 1, L // pp
    per_micro = (4 * blocks + first + last) * act + last * 3 * micro * T * 4
    tp_bytes = m * per_micro * 2 * (tp - 1) / tp
    pp_bytes = 0
    if pp > 1:
        pp_bytes = 32 + m * act * ((not last) + (not first)) + (first or last) * V // tp * d * 4
    psi = V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d
    padded = -(-(psi // (tp * pp)) // dp) * dp
    dp_bytes = 2 * (dp - 1) / dp * (padded * 4 + 16)
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}
'''},
    # the replica's loss added by both tensor-parallel ranks of the last stage: twice the global loss
    # three mistakes at once (a reviewer's): tp counts the embedding and the head on every stage
    # (4·blocks + 2), the tied gradient is sent whole (not divided by tp), the last stage's copy of the
    # word embedding (the head) is left out of the dp buffer; only a grid with tp > 1 and pp > 1 shows them
    {"22.3": '''
GRIDS = [(2, 1, 2), (1, 4, 1)]


def predict_sends(tp, pp, dp, stage, cfg, global_batch, m):
    V, T, d, L = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers
    micro = global_batch // (dp * m)
    act = micro * T * d * 4
    first, last, blocks = stage == 0, stage == pp - 1, L // pp
    per_micro = (4 * blocks + 2) * act + last * 3 * micro * T * 4
    tp_bytes = m * per_micro * 2 * (tp - 1) / tp
    pp_bytes = 0
    if pp > 1:
        pp_bytes = 32 + m * act * ((not last) + (not first)) + (first or last) * V * d * 4
    block = (3 * d * d + 3 * d + d * d + 4 * d * d + 4 * d + 4 * d * d) // tp + d + d + 4 * d
    local = blocks * block + first * (V // tp * d + T * d) + last * 2 * d
    padded = -(-local // dp) * dp
    dp_bytes = 2 * (dp - 1) / dp * (padded * 4 + 16)
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}
'''},
    # the 32-byte handshake counted on a single stage, which has no neighbour to tell
    {"22.1": '''
act = micro * seq * hidden * 4
total = 32 + m * act * ((stage < pp - 1) + (stage > 0))
if pp > 1 and stage in (0, pp - 1):
    total += 4 * embedding_shard
return total
'''},
    {"22.2": '''
dp, m = parts.topology.dp, parts.microbatches
n = idx.shape[0] // dp
mine = slice(parts.d * n, (parts.d + 1) * n)
stats = parts.pipeline.train_step(list(zip(idx[mine].chunk(m), targets[mine].chunk(m))), optimizer=parts.optimizer)
parts.optimizer.step()
loss = torch.tensor([stats.loss / dp if stats.loss is not None else 0.0], dtype=torch.float64)
comm.all_reduce(loss)
return stats, loss.item()
'''},
    # every replica trains on the whole batch: the same gradient and loss, at dp times the work (and the sends)
    {"22.2": '''
m = parts.microbatches
stats = parts.pipeline.train_step(list(zip(idx.chunk(m), targets.chunk(m))), optimizer=parts.optimizer)
parts.optimizer.step()
loss = torch.tensor([stats.loss / parts.topology.dp if stats.loss is not None and parts.t == 0 else 0.0])
comm.all_reduce(loss)
return stats, loss.item()
'''},
]
