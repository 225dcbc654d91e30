"""Chapter 22: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

# Task 22.1 (the reference's predict with another choice or another count), shared by the mistakes below
_PREDICT = '''
def predict(tp, pp, dp, cfg):
    V, T, d, L, m = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers, 4
    micro = 16 // (dp * m)
    act = micro * T * d * 4
    ar = 2 * (tp - 1) / tp
    block = (12 * d * d + 7 * d) // tp + 6 * d
    memory = sent = 0
    for stage in range(pp):
        first, last, blocks = stage == 0, stage == pp - 1, L // pp
        tp_b = m * ar * ((TP_CALLS) * act + last * 3 * micro * T * 4)
        pp_b = 0 if pp == 1 else 32 + m * act * ((not last) + (not first)) + (first or last) * V // tp * d * 4
        local = LOCAL
        padded = -(-local // dp) * dp
        dp_b = 2 * (dp - 1) / dp * (padded * 4 + 16)
        memory = max(memory, padded * (8 + ADAM))
        sent = max(sent, tp_b + pp_b + dp_b)
    return {"memory": memory, "sent": sent}
'''
_RIGHT_COUNT = dict(TP_CALLS="4 * blocks + first + last", ADAM="8 / dp",
                    LOCAL="blocks * block + first * (V // tp * d + T * d) + last * 2 * d + (last and pp > 1) * V // tp * d")


def _predict(**changes):
    code = _PREDICT
    for key, value in {**_RIGHT_COUNT, **changes}.items():
        code = code.replace(key, value)
    return code


RIGHT = {
    # the parameters counted tensor by tensor, each axis's bytes per stage in a list, the choice as a list
    "22.1": '''
def predict(tp, pp, dp, cfg):
    V, T, d, L = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers
    m, b = 4, 16 // (dp * 4)
    hidden = 4 * b * T * d
    split = [3 * d * d, 3 * d, d * d, 4 * d * d, 4 * d, 4 * d * d]   # qkv w, b; proj w; fc1 w, b; fc2 w
    kept = [d] * 6                                                  # proj b, fc2 b, ln1 w, b, ln2 w, b
    per_block = sum(x // tp for x in split) + sum(kept)
    stages = []
    for s in range(pp):
        n, calls, pp_sent = (L // pp) * per_block, m * 4 * (L // pp), 0.0
        if s == 0:
            n, calls = n + V * d // tp + T * d, calls + m
        if s == pp - 1:
            n, calls = n + 2 * d + (V * d // tp if pp > 1 else 0), calls + m
        if pp > 1:
            pp_sent = 32 + m * hidden * ((s > 0) + (s < pp - 1)) + (4 * V * d // tp if s in (0, pp - 1) else 0)
        tp_sent = 2 * (tp - 1) / tp * (calls * hidden + (3 * m * 4 * b * T if s == pp - 1 else 0))
        n = -(-n // dp) * dp
        dp_sent = (dp - 1) / dp * 2 * 4 * n + 2 * (dp - 1) / dp * 16
        stages.append((8 * n + 8 * n / dp, tp_sent + pp_sent + dp_sent))
    return {"memory": max(x for x, _ in stages), "sent": max(y for _, y in stages)}


CHOICE = [2, 4, 1]
''',
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
}

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the simulator's even split: Ψ / (tp × pp) per rank; it sees 1 × 4 × 2 fit (655,488 bytes), which
    # needs 820,992 on its first stage
    {"22.1": _predict(LOCAL="(V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d) // (tp * pp)") + '''

CHOICE = (1, 4, 2)
'''},
    # the right predictions, but the grid that sends the least is chosen without the cap
    {"22.1": _predict() + '''

CHOICE = (1, 4, 2)
'''},
    # the lab's grids measured once and typed in: right for the lab's model, nothing for another shape
    {"22.1": '''
MEASURED = {(1, 2, 4): (1184000, 808760), (1, 4, 2): (820992, 404784), (2, 1, 4): (1111040, 1258008),
            (2, 2, 2): (727296, 930608), (2, 4, 1): (566784, 825376), (4, 1, 2): (688896, 2003728),
            (4, 2, 1): (507392, 1926176)}


def predict(tp, pp, dp, cfg):
    memory, sent = MEASURED[(tp, pp, dp)]
    return {"memory": memory, "sent": sent}


CHOICE = (2, 4, 1)
'''},
    # the prediction that runs the lab: the measurement the check makes, not a prediction
    {"22.1": '''
def predict(tp, pp, dp, cfg):
    def measure(rank, world):
        r = lab.run(rank, world, tp=tp, pp=pp, steps=1, cfg=cfg)
        return sum(r["memory"][k] for k in ("params", "grads", "optimizer")), sum(r["ring_bytes_by_axis"].values())

    runs = zero_ref.launch(measure, 8, timeout=300)
    return {"memory": max(m for m, _ in runs), "sent": max(s for _, s in runs)}


CHOICE = (2, 4, 1)
'''},
    # the replica's loss added by both tensor-parallel ranks of the last stage: twice the global loss
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
