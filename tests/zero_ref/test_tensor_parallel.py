"""Tensor and sequence parallelism on real gloo ranks equal the single-device layers and model.

Every layer: the output (or this rank's slice of it), the input gradient and each rank's
weight-gradient shard equal the single-device layer's, in fp32, to rtol 1e-5 / atol 1e-6 (the
only difference is the order of additions: t partial sums reduced across ranks instead of one
matmul). The whole TP GPT: loss, logits, every gradient and the parameters after three SGD steps.
Communication: the bytes each block hands to collectives equal the theory. Activations: the bytes
a block saves for backward equal Korthikanti's formula (zero_ref.memory) for TP, TP+SP and
selective and full recompute. One launch per tp size runs everything and returns what it saw.
"""
import pytest

import zero_ref
from zero_ref.memory import activation_bytes_per_layer, activation_terms

RTOL, ATOL = 1e-5, 1e-6
S, B, H, A, V = 8, 2, 32, 4, 64  # sequence, batch, hidden, heads, vocab


def worker(rank, t):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    from zero_ref import comm
    from zero_ref.measure import saved_activation_bytes
    from zero_ref.models import GPT, GPTConfig, make_batch
    from zero_ref.models.gpt import MLP, Block, CausalSelfAttention
    from zero_ref.parallel import tensor as tp

    group = dist.group.WORLD
    failures, worst = [], {}

    def check(name, got, want):
        worst[name] = (got.detach() - want.detach()).abs().max().item()
        if got.shape != want.shape or not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
            failures.append(f"rank {rank}: {name}: max |Δ| = {worst[name]:.3g}, shapes {tuple(got.shape)} "
                            f"{tuple(want.shape)}")

    def part(x, how):  # this rank's part of a full tensor: sequence shard (dim 0) or feature slice
        return tp.shard(x, {"seq": 0, "feat": -1}[how], rank, t) if how else x

    def compare(name, ref, mod, x, x_part, y_part, sbh=False):
        """Same upstream gradient G on both sides; ref runs on [b, s, h] when ``sbh``."""
        torch.manual_seed(1)
        ref.zero_grad(set_to_none=True)
        x_ref = x.clone().requires_grad_(x.is_floating_point())
        y_ref = ref(x_ref.transpose(0, 1)).transpose(0, 1) if sbh else ref(x_ref)
        G = torch.randn_like(y_ref)
        (y_ref * G).sum().backward()
        x_tp = part(x, x_part).clone().requires_grad_(x.is_floating_point())
        y = mod(x_tp)
        (y * part(G, y_part)).sum().backward()
        tp.sync_sequence_parallel_grads(mod, group)
        check(f"{name} output", y, part(y_ref, y_part))
        if x.is_floating_point():
            check(f"{name} input grad", x_tp.grad, part(x_ref.grad, x_part))
        full = dict(ref.named_parameters())
        for pname, p in mod.named_parameters():
            check(f"{name} grad {pname}", p.grad, tp.local_part(p, full[pname].grad, group))

    torch.manual_seed(0)
    x = torch.randn(S, B, H)
    cfg = GPTConfig(vocab_size=V, seq_len=S, d_model=H, n_heads=A, n_layers=2)
    lin = nn.Linear(H, 3 * H)
    row = nn.Linear(3 * H, H)
    x3 = torch.randn(S, B, 3 * H)
    for sp in (False, True):
        tag = " SP" if sp else ""
        seq = "seq" if sp else None
        compare("column" + tag, lin, tp.ColumnParallelLinear.from_linear(lin, group, sequence_parallel=sp),
                x, seq, "feat")
        compare("row" + tag, row, tp.RowParallelLinear.from_linear(row, group, sequence_parallel=sp),
                x3, "feat", seq)
        attn = CausalSelfAttention(cfg)
        compare("attention" + tag, attn, tp.ParallelAttention(attn, group, sequence_parallel=sp), x, seq, seq, sbh=True)
        mlp = MLP(cfg)
        compare("mlp" + tag, mlp, tp.ParallelMLP(mlp, group, sequence_parallel=sp), x, seq, seq, sbh=True)
        blk = Block(cfg)
        compare("block" + tag, blk, tp.ParallelBlock(blk, group, sequence_parallel=sp), x, seq, seq, sbh=True)
        emb = nn.Embedding(V, H)
        ids = torch.randint(0, V, (S, B))
        compare("embedding" + tag, emb, tp.VocabParallelEmbedding(emb, group, sequence_parallel=sp), ids, None, seq)
    compare("column gather_output", lin, tp.ColumnParallelLinear.from_linear(lin, group, gather_output=True),
            x, None, None)
    compare("row input_is_parallel=False", row, tp.RowParallelLinear.from_linear(row, group, input_is_parallel=False),
            x3, None, None)

    # vocab-parallel cross-entropy: per-token loss and logit gradient
    logits, targets = torch.randn(S, B, V) * 3, torch.randint(0, V, (S, B))
    ref_l = logits.clone().requires_grad_()
    loss_ref = F.cross_entropy(ref_l.view(-1, V), targets.view(-1), reduction="none").view(S, B)
    loss_ref.sum().backward()
    mine = tp.shard(logits, -1, rank, t).requires_grad_()
    loss = tp.vocab_parallel_cross_entropy(mine, targets, group)
    loss.sum().backward()
    check("cross-entropy loss", loss, loss_ref)
    check("cross-entropy grad", mine.grad, tp.shard(ref_l.grad, -1, rank, t))

    # The whole model: loss, logits, gradients, and parameters after three optimizer steps. SGD with
    # momentum, not Adam: the key bias's true gradient is exactly zero (softmax ignores a constant
    # added to every score of a query), so what is computed there is rounding noise, and Adam divides
    # by √v and turns that noise into steps of size lr on either side.
    for name, kw, tie in (("GPT TP", {}, True), ("GPT SP", {"sequence_parallel": True}, True),
                          ("GPT SP untied", {"sequence_parallel": True}, False),
                          ("GPT TP selective recompute", {"recompute": "selective"}, True),
                          ("GPT SP full recompute", {"sequence_parallel": True, "recompute": "full"}, True)):
        torch.manual_seed(0)
        gcfg = GPTConfig(vocab_size=V, seq_len=S, d_model=H, n_heads=A, n_layers=2, tie_embeddings=tie)
        ref = GPT(gcfg)
        model = tp.TensorParallelGPT(ref, group, **kw)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        full = dict(ref.named_parameters())
        for step in range(3):
            idx, tg = make_batch(gcfg, B, seed=step)
            logits_ref, loss_ref = ref(idx, tg)
            logits, loss = model(idx, tg)
            loss_ref.backward()
            loss.backward()
            tp.sync_sequence_parallel_grads(model, group)
            check(f"{name} step {step} loss", loss, loss_ref)
            check(f"{name} step {step} logits", logits, tp.shard(logits_ref, -1, rank, t))
            for pname, p in model.named_parameters():
                check(f"{name} step {step} grad {pname}", p.grad, tp.local_part(p, full[pname].grad, group))
            opt_ref.step(), opt.step(), opt_ref.zero_grad(), opt.zero_grad()
        for pname, p in model.named_parameters():
            check(f"{name} params after 3 steps {pname}", p, tp.local_part(p, full[pname], group))
    # the check is not vacuous: another rank's shard of a gradient is not ours
    wrong = tp.shard(full["blocks.0.mlp.fc1.weight"], 0, (rank + 1) % t, t)
    not_vacuous = not torch.allclose(model.blocks[0].mlp.fc1.weight, wrong, rtol=RTOL, atol=ATOL)

    # communication of one block (fp32): forward and backward, TP and SP
    comm_log = {}
    for sp in (False, True):
        blk = tp.ParallelBlock(Block(cfg), group, sequence_parallel=sp)
        xin = (tp.shard(x, 0, rank, t) if sp else x).clone().requires_grad_()
        with comm.recording() as fwd:
            y = blk(xin)
        with comm.recording() as bwd:
            y.sum().backward()
        comm_log[sp] = [[(r.op, r.bytes) for r in log.records] + [log.total_wire_bytes()] for log in (fwd, bwd)]

    # activation bytes one block saves (bf16, dropout on): TP, TP+SP, TP+SP+selective recompute
    acts = {}
    for sp, rc in ((False, "none"), (True, "none"), (True, "selective"), (False, "selective"), (True, "full"),
                   (False, "full")):
        dcfg = GPTConfig(vocab_size=V, seq_len=S, d_model=H, n_heads=A, dropout=0.1)
        blk = tp.ParallelBlock(Block(dcfg), group, sequence_parallel=sp, recompute=rc).to(torch.bfloat16).train()
        xin = torch.randn(S // t if sp else S, B, H, dtype=torch.bfloat16, requires_grad=True)
        with saved_activation_bytes(blk) as saved:
            y = blk(xin)
        y.float().sum().backward()
        acts[(sp, rc)] = saved.total

    # bad input: clear errors naming the problem
    errors = []
    for make in (lambda: tp.ParallelAttention(CausalSelfAttention(GPTConfig(d_model=24, n_heads=6 if t == 4 else 3)), group),
                 lambda: tp.VocabParallelEmbedding(nn.Embedding(V + 1, H), group),
                 lambda: tp.TensorParallelGPT(GPT(cfg), group, sequence_parallel=True)(make_batch(cfg, B)[0][:, 1:])):
        try:
            make()
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    return {"failures": failures, "worst": max(worst.values()), "checks": len(worst), "comm": comm_log,
            "acts": acts, "errors": errors, "not_vacuous": not_vacuous}


@pytest.fixture(scope="module", params=[2, 4])
def results(request):
    return request.param, zero_ref.launch(worker, request.param, timeout=300)


def test_every_layer_and_the_whole_model_equal_single_device(results):
    t, res = results
    for r in res:
        assert r["failures"] == [], "\n".join(r["failures"])
        assert r["checks"] > 100 and r["worst"] < 1e-5 and r["not_vacuous"]


def test_block_communication_equals_the_theory(results):
    t, res = results
    sbh = S * B * H * 4  # fp32 bytes of one [s, b, h] activation
    ring = (t - 1) / t
    for r in res:
        (tp_fwd, tp_bwd), (sp_fwd, sp_bwd) = r["comm"][False], r["comm"][True]
        # TP: one all-reduce of b·s·h after attention and one after the MLP; backward the same two
        assert tp_fwd == [("all_reduce", sbh)] * 2 + [2 * 2 * ring * sbh]
        assert tp_bwd == [("all_reduce", sbh)] * 2 + [2 * 2 * ring * sbh]
        # SP: each all-reduce becomes all-gather (into the column-parallel layer) + reduce-scatter
        # (out of the row-parallel layer): the same ring traffic in forward.
        assert sp_fwd == [("all_gather", sbh), ("reduce_scatter", sbh)] * 2 + [2 * 2 * ring * sbh]
        # Backward also re-gathers each column-parallel input (only its shard was saved): 1.5× TP.
        assert sp_bwd == [("all_gather", sbh), ("all_gather", sbh), ("reduce_scatter", sbh)] * 2 + [6 * ring * sbh]


def test_block_activation_bytes_equal_korthikanti(results):
    t, res = results
    for r in res:
        for (sp, rc), measured in r["acts"].items():
            ln_stats = 0 if rc == "full" else 2 * 2 * 2 * S * B // (t if sp else 1)  # 2 LNs × (mean, rstd) × sb
            assert measured == activation_bytes_per_layer(S, B, H, A, tp=t, sp=sp, recompute=rc) + ln_stats
            # the term-by-term count (its norm statistics in bf16, as torch's CPU LayerNorm keeps them)
            assert measured == activation_terms(S, B, H, A, tp=t, sp=sp, recompute=rc, stat_bytes=2).total


def test_bad_sizes_are_clear_errors(results):
    t, res = results
    heads = 6 if t == 4 else 3
    assert res[0]["errors"] == [
        f"ParallelAttention: n_heads={heads} is not divisible by the tensor-parallel size {t}",
        f"VocabParallelEmbedding: vocab size={V + 1} is not divisible by the tensor-parallel size {t}",
        f"sequence parallelism: sequence length {S - 1} is not divisible by tp={t}",
    ]
