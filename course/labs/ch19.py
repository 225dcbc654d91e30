"""Chapter 19 on two ranks: the tensor-parallel GPT, with and without sequence parallelism, against one device.

``zero_ref.launch(tp_run, 2, cfg)`` runs it on two gloo ranks.
"""
from __future__ import annotations

TOL = dict(rtol=1e-5, atol=1e-6)  # fp32; only the order of additions differs


def tp_run(rank, world, cfg):
    """Without and with sp: comparisons with one device over 3 SGD steps; one block's collectives and saved bytes."""
    import torch
    import torch.distributed as dist
    from zero_ref import comm
    from zero_ref.measure import saved_activation_bytes
    from zero_ref.models import GPT, GPTConfig, make_batch
    from zero_ref.models.gpt import Block
    from zero_ref.parallel import tensor as tp

    group, out = dist.group.WORLD, {}
    for sp in (False, True):
        torch.manual_seed(0)
        ref = GPT(cfg)
        model = tp.TensorParallelGPT(ref, group, sequence_parallel=sp)
        out[("params", sp)] = sum(p.numel() for p in model.parameters())
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref, model)]
        same, full = [], dict(ref.named_parameters())
        for step in range(3):
            idx, targets = make_batch(cfg, 4, seed=step)
            logits_ref, loss_ref = ref(idx, targets)
            loss_ref.backward()
            with comm.recording() as log:
                logits, loss = model(idx, targets)
                loss.backward()
                if sp:
                    tp.sync_sequence_parallel_grads(model, group)
            out[("step ops", sp)] = log.by_op()
            same.append(torch.allclose(loss, loss_ref, **TOL))
            same.append(torch.allclose(logits, tp.shard(logits_ref, -1, rank, world), **TOL))
            same += [torch.allclose(p.grad, tp.local_part(p, full[n].grad, group), **TOL)
                     for n, p in model.named_parameters()]
            if step == 0:
                out[("loss", sp)] = (loss.item(), loss_ref.item())
            for o in opts:
                o.step()
                o.zero_grad()
        same += [torch.allclose(p, tp.local_part(p, full[n], group), **TOL) for n, p in model.named_parameters()]
        out[("equal", sp)] = (sum(same), len(same))
        # one block: the collectives of forward and of backward (fp32 activations [s, b, h])
        blk = model.blocks[0]
        x = torch.randn(cfg.seq_len // (world if sp else 1), 4, cfg.d_model, requires_grad=True)
        with comm.recording() as fwd:
            y = blk(x)
        with comm.recording() as bwd:
            y.sum().backward()
        out[("block", sp)] = [[(r.op, r.bytes) for r in log.records] for log in (fwd, bwd)]
        out[("block wire", sp)] = (fwd.total_wire_bytes(), bwd.total_wire_bytes())
        # what one bf16 block saves for backward, with dropout (1-byte masks), as Korthikanti counts
        torch.manual_seed(0)
        dcfg = GPTConfig(vocab_size=64, seq_len=64, d_model=64, n_heads=4, dropout=0.1)
        blk = tp.ParallelBlock(Block(dcfg), group, sequence_parallel=sp).to(torch.bfloat16).train()
        x = torch.randn(64 // (world if sp else 1), 2, 64, dtype=torch.bfloat16, requires_grad=True)
        with saved_activation_bytes(blk) as acts:
            blk(x)
        out[("saved", sp)] = acts.total
    return out


def _refused(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"Task 19.3 builds the split itself: zero_ref.parallel.tensor.{name} is not available here")
    return call


def attention_trial(rank, world, tp_attention):
    """A student's tensor-parallel attention on this rank against the one-process CausalSelfAttention (the same
    seed on every rank), at 2 heads per rank and at 1: the output, the gradients of x and of every weight (this
    rank's heads' rows of the fused QKV weight and its columns of the output projection; zero elsewhere), and the
    collectives of forward and of backward."""
    import torch
    from zero_ref import comm
    from zero_ref.models import GPTConfig
    from zero_ref.models.gpt import CausalSelfAttention
    from zero_ref.parallel import tensor

    for name in ("shard", "ColumnParallelLinear", "RowParallelLinear", "ParallelAttention"):
        setattr(tensor, name, _refused(name))  # the library's own split would answer the task
    out = []
    for n_heads in (2 * world, world):
        torch.manual_seed(0)
        C, T = 8 * n_heads, 6
        attn = CausalSelfAttention(GPTConfig(vocab_size=8, seq_len=T, d_model=C, n_heads=n_heads))
        with torch.no_grad():  # sharper attention than the 0.02 init, so a mixed-up head shows
            for p in attn.parameters():
                p.copy_(torch.randn_like(p) / C ** 0.5)
        x = torch.randn(3, T, C, requires_grad=True)
        full = [x, attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias]
        y_full = attn(x)
        dy = torch.randn_like(y_full)
        y_full.backward(dy)
        mine = [t.detach().clone().requires_grad_() for t in full]
        with comm.recording() as forward:
            y = tp_attention(*mine, n_heads, None)
        with comm.recording() as backward:
            y.backward(dy)
        c = C // world  # this rank's a/t whole heads in each of Q, K and V
        rows = torch.zeros(3 * C, dtype=torch.bool)
        for j in range(3):
            rows[j * C + rank * c: j * C + (rank + 1) * c] = True
        cols = torch.zeros(C, dtype=torch.bool)
        cols[rank * c:(rank + 1) * c] = True
        want = [full[0].grad, full[1].grad * rows[:, None], full[2].grad * rows, full[3].grad * cols, full[4].grad]
        # within 1e-5 of the tensor's largest entry: the attention core's summation order may differ (SDPA)
        close = lambda a, b: a is not None and a.shape == b.shape and bool((a - b).abs().max() <= 1e-5 * b.abs().max())
        out.append(dict(heads=n_heads, out=close(y, y_full), grads=[close(m.grad, w) for m, w in zip(mine, want)],
                        calls=[{op: int(v["calls"]) for op, v in log.by_op().items()} for log in (forward, backward)]))
    return out
