"""Chapter 6's harness: offload runs on real ranks, the simulator's offload sweep and its figure, and the runs and
one-process references of the exercises (the partition's parameter groups; the delayed update)."""
from unittest import mock

import torch

import sim
from zero_ref import offload
from zero_ref.models import GPT, make_batch
from zero_ref.optim import adam_step_
from zero_ref.stages import STAGES


def train(rank, world_size, runs, cfg, adam, steps, micro, bucket):
    """Each run ``(stage, precision, offload_optimizer, cpu_adam, offload_param)``: parameters, tier and link bytes."""
    out = {}
    for stage, precision, off, cpu_adam, par in runs:
        torch.manual_seed(0)
        net = GPT(cfg)
        kw = {"param_persistence_threshold": 0} if stage == 3 else {}
        opt = STAGES[stage](net, adam=adam, precision=precision, reduce_bucket_size=bucket,
                            offload_optimizer=off and {"device": off}, offload_param=par and {"device": par},
                            cpu_adam=cpu_adam, **kw)
        link = opt.offload.link if opt.offload else None
        for step in range(steps):
            idx, targets = make_batch(cfg, micro * world_size, seed=step)
            mine = slice(rank * micro, (rank + 1) * micro)
            before = (link.d2h_bytes, link.h2d_bytes) if link else (0, 0)
            _, loss = net(idx[mine], targets[mine])
            opt.backward(loss)
            opt.step()
        moved = (link.d2h_bytes - before[0], link.h2d_bytes - before[1]) if link else None  # the last step
        state = opt.state_dict() if stage == 3 else net.state_dict()   # (ZeRO-3: gathers, i.e. copies up)
        out[stage, precision, off, cpu_adam, par] = dict(
            params=torch.cat([v.float().flatten() for v in state.values()]), tiers=offload.tier_bytes(opt),
            link=moved, padded=sum(b.layout.padded_numel for b in opt.buckets))
    return out


def offload_sweep(cluster, models, micro_batches):
    """ZeRO-2 (fp16, full recomputation) simulated without and with offload: ``{(model, off, mb): result}``."""
    rows = {}
    for name in models:
        model = sim.Model.preset(name)
        for off in ("none", "cpu"):
            for mb in micro_batches:
                plan = sim.Plan(zero_stage=2, dp=1, micro_batch_size=mb, offload_optimizer=off, precision="fp16",
                                recompute="full", gradient_clipping=0.0)
                rows[name, off, mb] = sim.simulate(model, cluster, plan)
    return rows


def plot_offload_sweep(rows, colors, micro_batches):
    """Left: step time against tokens per step (hollow: does not fit); right: offload's slowdown."""
    import matplotlib.pyplot as plt  # here, not at the top: the ranks import this module and draw nothing

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, color in colors.items():
        xs = [mb * sim.Model.preset(name).seq for mb in micro_batches]
        for off, style in (("none", "--"), ("cpu", "-")):
            results = [rows[name, off, mb] for mb in micro_batches]
            axes[0].plot(xs, [r.step_time for r in results], style, color=color,
                         label=f"{name[5:]}" + (" offload" if off == "cpu" else ""))
            for x, r in zip(xs, results):
                axes[0].plot(x, r.step_time, "o", color=color, mfc=color if r.fits else "white", ms=5)
        over = [rows[name, "cpu", mb].step_time / rows[name, "none", mb].step_time for mb in micro_batches]
        axes[1].plot(xs, over, "o-", color=color, label=name[5:])
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("tokens per step")
    axes[0].set_ylabel("simulated step time (s)")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("tokens per step")
    axes[1].set_ylabel("offload / no offload step time")
    axes[1].axhline(1, color="grey", lw=0.8)
    axes[1].legend(fontsize=8)
    fig.suptitle("one V100-32GB, ZeRO-2, fp16, full recomputation (sim)", fontsize=10)
    plt.tight_layout()
    plt.show()


def ex_model(cfg):
    """The course GPT in bf16, its parameters views into one flat buffer padded to a multiple of 2 ranks."""
    torch.manual_seed(0)
    net = GPT(cfg).to(torch.bfloat16)
    params = list(net.parameters())
    numel = sum(p.numel() for p in params)
    flat = torch.zeros(-(-numel // 2) * 2, dtype=torch.bfloat16)
    offset = 0
    for p in params:
        flat[offset:offset + p.numel()] = p.detach().reshape(-1)
        p.data = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return net, params, flat


def ex_grad(cfg, micro, net, params, flat, rank, t):
    """Rank ``rank``'s local gradient at step t (its ``micro`` of the step's 2·micro sequences), flat and padded."""
    idx, targets = make_batch(cfg, micro * 2, seed=100 + t)
    loss = net(idx[rank * micro:(rank + 1) * micro], targets[rank * micro:(rank + 1) * micro])[1]
    grads = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])
    return torch.cat([grads, torch.zeros(flat.numel() - grads.numel(), dtype=flat.dtype)])


def offload_exercise(rank, world_size, make_offload, cfg, adam, micro, steps):
    """``steps`` steps of ``make_offload``'s step, without and with delay: ``{delay: (flat16, bytes per step)}``."""
    out = {}
    with _references_off():
        for delay in (False, True):
            net, params, flat = ex_model(cfg)
            link = offload.Link("cpu", pin_memory=True)       # (pinning needs CUDA: here a plain host buffer)
            step = make_offload(flat, rank, world_size, link, adam, delay)
            moved = []
            for t in range(1, steps + 1):
                grad = ex_grad(cfg, micro, net, params, flat, rank, t)
                before = (link.d2h_bytes, link.h2d_bytes)
                step(grad, t)
                moved.append((link.d2h_bytes - before[0], link.h2d_bytes - before[1]))
            out[delay] = flat.clone(), moved
    return out


def _references_off():
    """On a rank, while the exercise runs: the one-process references raise (they are the check's, not an answer)."""
    refuse = mock.Mock(side_effect=RuntimeError("the one-process reference is the check's: build the step on the ranks"))
    return mock.patch.multiple(__name__, one_process_reference=refuse, group_reference=refuse)


def one_process_reference(cfg, adam, micro, steps, lag):
    """AdamW in one process on the mean of both ranks' gradients, taken ``lag`` steps late: the bf16 parameters."""
    net, params, flat = ex_model(cfg)
    master, m, v = flat.float(), torch.zeros(flat.numel()), torch.zeros(flat.numel())
    seen = [flat.clone()]              # the 16-bit parameters after 0, 1, 2, ... Adam steps
    for t in range(1, steps + 1):
        flat.copy_(seen[max(t - 1 - lag, 0)])
        grad = (ex_grad(cfg, micro, net, params, flat, 0, t) + ex_grad(cfg, micro, net, params, flat, 1, t)).float() / 2
        adam_step_(master, grad, m, v, t, adam)
        seen.append(master.to(torch.bfloat16))
    return seen[steps - lag]


def mlp_flat(widths, world_size):
    """A tanh MLP in fp32, its parameters views into one flat buffer padded to a multiple of ``world_size``,
    and the spans ``(start, end, decays)`` of its parameters there (biases take no weight decay)."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
    params = [p for layer in layers for p in (layer.weight, layer.bias)]
    numel = sum(p.numel() for p in params)
    flat = torch.zeros(-(-numel // world_size) * world_size)
    spans, offset = [], 0
    for p in params:
        flat[offset:offset + p.numel()] = p.detach().reshape(-1)
        p.data = flat[offset:offset + p.numel()].view_as(p)
        spans.append((offset, offset + p.numel(), p.dim() > 1))
        offset += p.numel()
    return layers, params, flat, spans


def mlp_grad(layers, params, flat, rank, t):
    """Rank ``rank``'s local gradient at step t (its own 4 samples), flat and padded."""
    gen = torch.Generator().manual_seed(1000 * t + rank)
    x = torch.randn(4, layers[0].in_features, generator=gen)
    y = torch.randn(4, layers[-1].out_features, generator=gen)
    for i, layer in enumerate(layers):
        x = layer(x) if i == len(layers) - 1 else torch.tanh(layer(x))
    grads = torch.autograd.grad(((x - y) ** 2).mean(), params)
    g = torch.cat([g.reshape(-1) for g in grads])
    return torch.cat([g, torch.zeros(flat.numel() - g.numel())])


def group_exercise(rank, world_size, make_group_step, widths, cfg, steps, max_norms):
    """``steps`` steps of ``make_group_step``'s step per ``max_norm``: {max_norm: (flat, norms, link bytes per step)}."""
    from zero_ref import comm

    out = {}
    with _references_off():
        for max_norm in max_norms:
            layers, params, flat, spans = mlp_flat(widths, world_size)
            link = offload.Link("cpu", pin_memory=True)
            step = make_group_step(flat, spans, rank, world_size, link, cfg, max_norm)
            S = flat.numel() // world_size
            norms, moved = [], []
            for t in range(1, steps + 1):
                shard = torch.empty(S)
                comm.reduce_scatter(shard, mlp_grad(layers, params, flat, rank, t), op="avg")   # on the device
                before = (link.d2h_bytes, link.h2d_bytes)
                norms.append(step(shard, t))
                moved.append((link.d2h_bytes - before[0], link.h2d_bytes - before[1]))
            out[max_norm] = flat.clone(), norms, moved
    return out


def group_reference(widths, cfg, steps, max_norm, world_size):
    """torch.optim.AdamW in one process, weight decay on the weights only, gradients clipped to ``max_norm``
    by their global norm (torch.nn.utils.clip_grad_norm_): the flat parameters and the norm of every step."""
    layers, params, flat, spans = mlp_flat(widths, world_size)
    decay = [p for p in params if p.dim() > 1]
    rest = [p for p in params if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, foreach=False)
    norms = []
    for t in range(1, steps + 1):
        mean = sum(mlp_grad(layers, params, flat, r, t) for r in range(world_size)) / world_size
        offset = 0
        for p in params:
            p.grad = mean[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm)))
        opt.step()
    return flat.clone(), norms
