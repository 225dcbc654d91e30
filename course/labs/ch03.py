"""Chapter 3's harness: the stages against data parallelism on real ranks (chapter 4 runs them too), the
flat-buffer figure, Task 3.3's check.

The rank functions run under ``zero_ref.launch`` (cloudpickle sends them by name, so the child imports this
module); everything a chapter's cell sets (model config, Adam, the run list, the student's class) comes in
as an argument.
"""
import torch

from course.i18n import _
from zero_ref import comm
from zero_ref.measure import unique_storage_bytes
from zero_ref.models import GPT, make_batch
from zero_ref.stages import STAGES

RANK_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]


def train(rank, world_size, runs, cfg, adam, steps, micro):
    """Each run of ``runs`` on this rank: (precision, stage), or (precision, stage, GAS, reduce_bucket_size) as
    chapter 4 varies them. Per run: final parameters, bytes held, communication, padding, the buckets'
    (numel, padded numel), and how many collectives had been issued as each gradient of the first backward
    arrived."""
    out = {}
    for run in runs:
        precision, stage, gas, bucket = (*run, 1, None) if len(run) == 2 else run
        torch.manual_seed(0)                                   # the same initial weights on every rank
        model = GPT(cfg)
        sizes = {} if bucket is None else {"reduce_bucket_size": bucket}
        opt = STAGES[stage](model, adam=adam, precision=precision, gradient_accumulation_steps=gas, **sizes)
        issued = []                                            # collectives issued when each gradient arrived
        with comm.recording() as log:
            for p in model.parameters():                       # registered after the stage's own hooks
                p.register_post_accumulate_grad_hook(lambda p: issued.append(len(log.records)))
            for step in range(steps):
                idx, targets = make_batch(cfg, micro * world_size * gas, seed=step)   # one global batch
                for k in range(gas):
                    start = (k * world_size + rank) * micro                          # this rank's part of it
                    _, loss = model(idx[start:start + micro], targets[start:start + micro])
                    opt.backward(loss)
                    opt.step()
        out[run] = {
            "params": torch.cat([p.detach().float().flatten() for p in model.parameters()]),
            "held": {cat: unique_storage_bytes(ts) for cat, ts in opt.state_tensors().items()},
            "comm": log.by_op(),
            "padded": sum(b.layout.padded_numel for b in opt.buckets),
            "buckets": [(b.layout.numel, b.layout.padded_numel) for b in opt.buckets],
            "issued": issued[:len(list(model.parameters()))],   # the first backward
        }
    return out


def max_diff(a, b):
    """Largest |a - b| of two tensors."""
    return (a - b).abs().max().item()


def draw_owners(ax, lay, y, height):
    """Colour each rank's shard of a flat layout; hatch the padding."""
    import matplotlib.pyplot as plt  # here, not at the top: the ranks import this module and draw nothing

    for r in range(lay.world_size):
        lo, hi = lay.shard_range(r)
        ax.add_patch(plt.Rectangle((lo, y), hi - lo, height, color=RANK_COLORS[r], alpha=0.85))
        ax.text((lo + hi) / 2, y + height / 2, f"rank {r}", ha="center", va="center", color="white", fontsize=9)
    if lay.padding:
        ax.add_patch(plt.Rectangle((lay.numel, y), lay.padding, height, facecolor="white", edgecolor="grey",
                                   hatch="///", linewidth=0.5))


def flat_buffer_figure(toy, layout, names, straddlers):
    """Two flat buffers coloured by owner: ``toy`` element by element, ``layout`` (parameters ``names``) to scale."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 4.6))
    draw_owners(ax1, toy, 0, 1)
    for k, (name, start, n) in enumerate(zip("abc", toy.offsets, toy.numels)):
        for e in range(n):
            ax1.add_patch(plt.Rectangle((start + e, 1.15), 1, 0.8, facecolor=["#e0e0e0", "#bdbdbd"][k % 2],
                                        edgecolor="white"))
            ax1.text(start + e + 0.5, 1.55, f"{name}{e}", ha="center", va="center", fontsize=7)
    for e in range(toy.numel, toy.padded_numel):
        ax1.text(e + 0.5, 1.55, _("pad"), ha="center", va="center", fontsize=7, color="grey")
    for r in range(1, 4):
        ax1.axvline(toy.shard_range(r)[0], color="black", linewidth=1.2)
    ax1.set_xlim(0, toy.padded_numel)
    ax1.set_ylim(0, 2.05)
    ax1.set_yticks([0.5, 1.55], [_("owner"), _("element")])
    ax1.set_title(f"{toy}", fontsize=9)

    draw_owners(ax2, layout, 0, 1)
    for k, (name, start, n) in enumerate(zip(names, layout.offsets, layout.numels)):
        split = name in straddlers
        ax2.add_patch(plt.Rectangle((start, 1.15), n, 0.8,
                                    facecolor="#e57373" if split else ["#e0e0e0", "#bdbdbd"][k % 2],
                                    edgecolor="white", linewidth=0.3))
        short = name.replace("blocks.", "b").replace(".weight", ".w").replace(".bias", ".b")
        if n > 2000:
            ax2.text(start + n / 2, 1.55, short, ha="center", va="center", fontsize=6)
        elif split:  # too thin to label inside: point at it
            cut = layout.shard_range(3)[0] - start
            ax2.annotate(_("{name} ({n} elements, split {a} | {b})").format(name=short, n=n, a=cut, b=n - cut),
                         xy=(start + n / 2, 1.95),
                         xytext=(start - 5200, 2.35), fontsize=7, color="#c62828",
                         arrowprops=dict(arrowstyle="->", color="#c62828"))
    for r in range(1, 4):
        ax2.axvline(layout.shard_range(r)[0], color="black", linewidth=1.2)
    ax2.set_xlim(0, layout.padded_numel)
    ax2.set_ylim(0, 2.7)
    ax2.set_yticks([0.5, 1.55], [_("owner"), _("parameter")])
    ax2.set_xlabel(_("position in the flat buffer (elements)"))
    ax2.set_title(_("course GPT: {layout}").format(layout=layout), fontsize=9)
    fig.tight_layout()
    return fig


def make_mlp():
    """Task 3.3's MLP (Ψ = 39), the same weights on every call."""
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def held_tensors(obj):
    """Every tensor an object keeps in its attributes, also inside lists, tuples, sets and dicts."""
    found, todo = [], list(vars(obj).values())
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, dict):
            todo += list(x.keys()) + list(x.values())
        elif isinstance(x, (list, tuple, set)):
            todo += list(x)
    return found


def zero1_exercise(rank, world_size, opt_cls, adam, steps, X, Y):
    """Task 3.3's check on a rank: ``opt_cls`` trains the MLP on this rank's half of the batch, watched."""
    net = make_mlp()
    opt = opt_cls(net.parameters(), adam, rank, world_size)
    rows = slice(rank * len(X) // world_size, (rank + 1) * len(X) // world_size)
    calls = []
    for _ in range(steps):
        for p in net.parameters():
            p.grad = None
        torch.nn.functional.mse_loss(net(X[rows]), Y[rows]).backward()
        with comm.recording() as log:
            opt.step()
        calls.append([(r.op, r.bytes) for r in log.records])
    model_tensors = [t for p in net.parameters() for t in (p, p.grad) if t is not None]
    held = unique_storage_bytes(held_tensors(opt), exclude=model_tensors)
    params = torch.cat([p.detach().flatten() for p in net.parameters()])
    return params, opt.exp_avg.detach().clone(), opt.exp_avg_sq.detach().clone(), calls, held


def adamw_reference(adam, steps, X, Y):
    """Task 3.3's MLP after ``torch.optim.AdamW`` in one process on the whole batch: (model, flat tensors)."""
    net = make_mlp()
    opt = torch.optim.AdamW(net.parameters(), lr=adam.lr, betas=adam.betas, eps=adam.eps,
                            weight_decay=adam.weight_decay, foreach=False)
    for _ in range(steps):
        torch.nn.functional.mse_loss(net(X), Y).backward()
        opt.step()
        opt.zero_grad()
    want = {"params": torch.cat([p.detach().flatten() for p in net.parameters()])}
    for key in ("exp_avg", "exp_avg_sq"):
        want[key] = torch.cat([opt.state[p][key].flatten() for p in net.parameters()])
    return net, want
