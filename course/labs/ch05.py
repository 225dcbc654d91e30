"""Chapter 5's harness: the per-rank experiments on ZeRO-3, the graded checks' rank functions, the figures.

The rank functions run under ``zero_ref.launch`` (cloudpickle sends them by name, so the child imports this
module); everything a chapter's cell sets (model config, Adam, the run table, the student's code) comes in
as an argument.
"""
import gc
import time
import weakref

import torch

from zero_ref import comm
from zero_ref.measure import PeakTensorBytes, unique_storage_bytes
from zero_ref.models import GPT, make_batch
from zero_ref.stages import STAGES, ZeroStage3
from zero_ref.stages.zero3 import GatheredParameters, Init, unit_of

PART_COLORS = ["#55a868", "#4c72b0", "#c44e52", "#8c8c8c"]


def train(rank, world_size, runs, cfg, adam, micro):
    """Each run of ``runs`` on this rank: final state, bytes held, last step's records and gather timeline."""
    out = {}
    for name, (stage, precision, gas, steps, knobs) in runs.items():
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = STAGES[stage](model, adam=adam, precision=precision, gradient_accumulation_steps=gas, **knobs)
        events = []                                          # (phase, kind, unit, gathered elements)
        if stage == 3:
            opt.gather_log = []
        for step in range(steps):
            events.clear()                                   # keep the last step's timeline
            records = []                                     # (phase, op, dtype, payload bytes, wire bytes)
            idx, targets = make_batch(cfg, micro * world_size * gas, seed=step)   # one global batch
            for m in range(gas):
                start = (m * world_size + rank) * micro
                for phase in ("forward", "backward", "step"):
                    with comm.recording() as log:
                        if phase == "forward":
                            _, loss = model(idx[start:start + micro], targets[start:start + micro])
                        elif phase == "backward":
                            opt.backward(loss)
                        else:
                            opt.step()
                    records += [(phase, r.op, r.dtype, r.bytes, r.wire_bytes) for r in log.records]
                    if stage == 3:
                        events += [(phase, *e) for e in opt.gather_log]
                        opt.gather_log.clear()
        out[name] = {
            "state": opt.state_dict() if stage == 3 else {k: v.clone() for k, v in model.state_dict().items()},
            "held": {cat: unique_storage_bytes(ts) for cat, ts in opt.state_tensors().items()},
            "padded": sum(b.layout.padded_numel for b in opt.buckets),
            "records": records,                              # the last optimizer step
            "events": list(events),
            "units": [dict(name=u.name, numel=u.numel, size=u.size, shard=u.layout.shard_numel,
                           persistent=u.persistent) for u in opt.units] if stage == 3 else None,
            "peak_live": opt.peak_live_numel if stage == 3 else None,
        }
    return out


def zero3_extras(rank, world_size, cfg, big_cfg, adam, micro):
    """zero.Init on ``big_cfg``, a GatheredParameters edit, module.state_dict(), and a block skipped on rank 1."""
    out = {}
    # zero.Init: build a model without ever holding it whole.
    with PeakTensorBytes() as normal:
        torch.manual_seed(0)
        whole = GPT(big_cfg)
    with PeakTensorBytes() as parted:
        with Init():
            torch.manual_seed(0)
            big = GPT(big_cfg)
    units = list(dict.fromkeys(unit_of(p) for p in big.parameters()))
    out["init"] = dict(normal=normal.peak, parted=parted.peak, units=len(units),
                       model=4 * sum(p.numel() for p in whole.parameters()),
                       shards=4 * sum(u.layout.shard_numel for u in units),
                       largest=4 * max(u.numel for u in units),
                       head_shard=4 * -(-big_cfg.vocab_size * big_cfg.d_model // world_size),  # head's own, untied
                       buffers=sum(b.untyped_storage().nbytes() for b in big.buffers()))
    with comm.recording() as log:
        ZeroStage3(big, adam=adam, param_persistence_threshold=0)   # adopts Init's units
    out["adopt_bytes"] = log.total_bytes()
    with GatheredParameters(big.parameters()):
        out["same_init"] = max((a - b).abs().max().item() for a, b in zip(big.parameters(), whole.parameters()))

    # GatheredParameters(modifier_rank=0): rank 0's edit wins, on every rank.
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = ZeroStage3(model, adam=adam, param_persistence_threshold=0)
    w = model.ln_f.weight
    shapes = [tuple(w.shape)]
    with torch.no_grad():
        with GatheredParameters(model.ln_f.parameters(), modifier_rank=0):
            shapes.append(tuple(w.shape))
            w.fill_(2.0 if rank == 0 else -7.0)
        shapes.append(tuple(w.shape))
        with GatheredParameters(model.ln_f.parameters()):          # modifier_rank=None: edits are dropped
            w.fill_(9.0)
    out["edit"] = dict(shapes=shapes, values=sorted(set(opt.state_dict()["ln_f.weight"].tolist())),
                       master=sorted(set(unit_of(w).part.tolist())))
    try:
        model.state_dict()
        out["state_dict"] = "no error"
    except RuntimeError as e:
        out["state_dict"] = str(e)

    # Different control flow: rank 1 skips block 1 on the second step.
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = ZeroStage3(model, adam=adam, param_persistence_threshold=0, prefetch_bucket_size=0)
    out["control_flow"] = "no error"
    for step in range(2):
        if step == 1 and rank == 1:
            model.blocks[1].forward = lambda x: x
        idx, targets = make_batch(cfg, micro * world_size, seed=step)
        try:
            _, loss = model(idx[rank * micro:(rank + 1) * micro], targets[rank * micro:(rank + 1) * micro])
            opt.backward(loss)
            opt.step()
        except RuntimeError as e:
            out["control_flow"] = str(e)
            break
    return out


def mlp_step(rank, world_size, adam):
    """Task 5.1's measurement: one ZeRO-3 step of a 3-layer MLP, communication per phase."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(),
                              torch.nn.Linear(32, 8))
    opt = ZeroStage3(net, adam=adam, param_persistence_threshold=0, prefetch_bucket_size=0)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(4, 16, generator=gen, requires_grad=True)   # as inside a network: the first layer's
    y = torch.randn(4, 8, generator=gen)                         # backward then reads its weight too
    records = []
    for phase in ("forward", "backward", "step"):
        with comm.recording() as log:
            if phase == "forward":
                loss = ((net(x) - y) ** 2).mean()
            elif phase == "backward":
                opt.backward(loss)
            else:
                opt.step()
        records += [(phase, r.op, r.dtype, r.bytes, r.wire_bytes) for r in log.records]
    return {"padded": sum(u.size for u in opt.units), "records": records}


def experiment(rank, world_size, runs, cfg, adam, micro, big_cfg):
    """The chapter's one launch: the run table, then the ZeRO-3 extras, then Task 5.1's MLP step."""
    return {"runs": train(rank, world_size, runs, cfg, adam, micro),
            "extras": zero3_extras(rank, world_size, cfg, big_cfg, adam, micro),
            "mlp": mlp_step(rank, world_size, adam)}


def max_diff(a, b):
    """Largest |a - b| over two state dicts with the same keys."""
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def comm_figure(stacks, gas, psi, half, k):
    """Wire bytes per step by purpose for stages 0–3 (``stacks``), and the totals at GAS = ``k`` (``gas``)."""
    import matplotlib.pyplot as plt  # here, not at the top: the ranks import this module and draw nothing

    data2 = gas["stage 0–1"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for i, run in enumerate(stacks):
        bottom = 0.0
        for j, (label, value) in enumerate(stacks[run].items()):
            ax.bar(i, value / 1e3, 0.6, bottom=bottom / 1e3, color=PART_COLORS[j], label=label if i == 3 else None)
            bottom += value
        ax.text(i, bottom / 1e3 + 1.5, f"{bottom / 1e3:.1f}", ha="center", fontsize=8)
    for mult, style in ((2, "--"), (3, ":")):
        ax.axhline(mult * psi * half / 1e3, color="black", linestyle=style, linewidth=1, label=f"{mult}Ψ (theory)")
    ax.set_xticks(range(len(stacks)), list(stacks))
    ax.set_ylabel("kB sent per step and rank")
    ax.set_ylim(0, 150)
    ax.set_title("GAS = 1", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax2.bar(range(3), [v / 1e3 for v in gas.values()], 0.6, color=["#4c72b0", "#dd8452", "#c44e52"])
    for i, (label, v) in enumerate(gas.items()):
        ax2.text(i, v / 1e3 + 8, f"{v / data2:.2f}×", ha="center", fontsize=8)
    for mult, style in ((2, "--"), ((k + 1), "-."), (3 * k, ":")):
        ax2.axhline(mult * psi * half / 1e3, color="black", linestyle=style, linewidth=1)
    ax2.set_xticks(range(3), list(gas))
    ax2.set_ylim(0, 600)
    ax2.set_title(f"GAS = {k}: lines 2Ψ, (k+1)Ψ, 3kΨ", fontsize=10)
    fig.tight_layout()
    return fig


def gather_exercise(rank, world_size, gather_unit, cfg, adam):
    """Task 5.2's check on a rank: ``gather_unit`` on every unit of the course GPT, against ``Unit.gather()``."""
    torch.manual_seed(0)
    normal = [p.detach().clone() for p in GPT(cfg).parameters()]              # built normally: full tensors
    torch.manual_seed(0)
    model = GPT(cfg)
    reference = dict(zip(map(id, model.parameters()), normal))                # same order, same values
    opt = ZeroStage3(model, adam=adam, param_persistence_threshold=0)
    rows = []
    for u in [s.unit for s in opt.units]:                                     # the zero3.Units it keeps
        before = u.part.clone()
        with comm.recording() as log:
            full = gather_unit(u.part, world_size)
        calls = [(r.op, r.bytes) for r in log.records]
        params_ok = all(torch.equal(view, reference[id(p)])
                        for p, view in zip(u.params, u.layout.unflatten(full)))
        u.gather()                                                            # the library's gather
        rows.append(dict(name=u.name, size=tuple(full.shape), same=torch.equal(full, u.full), params=params_ok,
                         calls=calls, want=[("all_gather", 4 * u.size)], new=full.data_ptr() != u.part.data_ptr(),
                         part_kept=torch.equal(before, u.part)))
        u.release()
    return rows


def make_mlp3():
    """Task 5.3's MLP: three linear layers with biases, the same weights on every call."""
    torch.manual_seed(2)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 3))


def kept_tensors(module):
    """Every tensor a module tree keeps in its attributes, also inside lists, tuples, dicts and submodules."""
    found, seen, todo = [], set(), [module]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, torch.nn.Module):
            todo += list(vars(x).values())
        elif isinstance(x, dict):
            todo += list(x.keys()) + list(x.values())
        elif isinstance(x, (list, tuple, set)):
            todo += list(x)
    return found


def zero3_exercise(rank, world_size, layer_cls, X, Y):
    """Task 5.3's check on a rank: the MLP with ``layer_cls`` for its Linears, one forward and backward, watched."""
    net = make_mlp3()
    model = torch.nn.Sequential(*[layer_cls(m, rank, world_size) if isinstance(m, torch.nn.Linear) else m
                                  for m in net])
    events, state = [], {"live": 0, "peak": 0, "phase": "set-up"}

    def freed():
        state["live"] -= 1

    def settle():  # gloo's worker thread lets go of a finished collective's buffer a moment after wait() returns
        for _ in range(200):
            gc.collect()
            if state["live"] == 0:
                return
            time.sleep(0.005)

    def watched(op, tensor, group):                           # every buffer the layers gather into, until freed
        if op != "all_gather":
            return
        assert tensor.device.type != "meta", "gather into one flat tensor"
        settle()  # a hook runs before the call: let gloo let go of the last buffer first
        weakref.finalize(tensor.untyped_storage(), freed)
        state["live"] += 1
        state["peak"] = max(state["peak"], state["live"])
        events.append((state["phase"], "gather", tensor.numel()))

    with comm.hooked(watched):
        rows = slice(rank * len(X) // world_size, (rank + 1) * len(X) // world_size)
        state["phase"] = "forward"
        with comm.recording() as fwd_log:
            loss = torch.nn.functional.mse_loss(model(X[rows]), Y[rows])
        settle()
        live_after_forward = state["live"]
        state["phase"] = "backward"
        with comm.recording() as bwd_log:
            loss.backward()
        settle()
    layers = [m for m in model if isinstance(m, layer_cls)]
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    return dict(loss=loss.item(), grads=[m.shard.grad.detach().clone() for m in layers], events=events,
                peak=state["peak"], live_after_forward=live_after_forward, live_at_end=state["live"],
                fwd=[(r.op, r.bytes) for r in fwd_log.records], bwd=[(r.op, r.bytes) for r in bwd_log.records],
                param_bytes=unique_storage_bytes(kept_tensors(model)), grad_bytes=unique_storage_bytes(grads))


def mlp3_reference(X, Y, world_size):
    """Task 5.3's MLP in one process, whole batch: loss, per-layer numel, flat padded gradients (weight, bias)."""
    net = make_mlp3()
    loss = torch.nn.functional.mse_loss(net(X), Y)
    loss.backward()
    numels, grads = [], []
    for m in net:
        if isinstance(m, torch.nn.Linear):
            numels.append(m.weight.numel() + m.bias.numel())
            flat = torch.zeros(-(-numels[-1] // world_size) * world_size)
            flat[:numels[-1]] = torch.cat([m.weight.grad.flatten(), m.bias.grad.flatten()])
            grads.append(flat)
    return loss.item(), numels, grads


ZEROPP = {"ZeRO-3": {}, "qwZ": dict(quantized_weights=True), "hpZ": dict(hpz_partition_size=2),
          "qwZ + hpZ": dict(quantized_weights=True, hpz_partition_size=2)}


def zeropp_run(rank, world_size, cfg, adam, micro, steps=2):
    """ZeRO-3 and ZeRO++ (``ZEROPP``, nodes of 2 ranks) on the course GPT: the last step's collectives
    (op, dtype, bytes, group size), the secondary partition's elements after backward, the losses."""
    from zero_ref.stages.zero3.zeropp import ZeroPP
    out = {}
    for name, knobs in ZEROPP.items():
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = ZeroStage3(model, adam=adam, zeropp=ZeroPP(**knobs), param_persistence_threshold=0)
        losses = []
        for step in range(steps):
            idx, targets = make_batch(cfg, micro * world_size, seed=step)
            with comm.recording() as log:
                _, loss = model(idx[rank * micro:(rank + 1) * micro], targets[rank * micro:(rank + 1) * micro])
                opt.backward(loss)
                secondary = sum(u.unit.zeropp.secondary.numel() for u in opt.units
                                if u.unit.zeropp is not None and u.unit.zeropp.secondary is not None)
                opt.step()
            losses.append(loss.item())
        out[name] = dict(records=[(r.op, r.dtype, r.bytes, r.group_size) for r in log.records if r.dtype != "int64"],
                         secondary=secondary, losses=losses, numel=sum(u.size for u in opt.units))
    return out


class _Unit:
    """What the library's ``UnitGather`` reads of a unit: its shard, group, size and full buffer."""

    def __init__(self, part, world_size):
        self.part, self.group, self.size = part, None, part.numel() * world_size
        self.full = torch.empty(self.size)

    def device_part(self):
        return self.part


def hpz_schedule(rank, world_size, make, unit_numel, g, steps=2):
    """Two optimizer steps of one unit's gathers (forward, backward) through ``make(primary, g)``'s object (or,
    with ``make=None``, the library's ``UnitGather``): per gather the group's ranks, the bytes, whether the
    values are the unit's, and the secondary's elements after the step's first release."""
    import torch.distributed as dist
    from zero_ref.stages.zero3.secondary_partition import UnitGather, new_subgroups
    s = unit_numel // world_size
    truth = [torch.randn(unit_numel, generator=torch.Generator().manual_seed(step)) for step in range(steps)]
    seen = []

    def hook(op, tensor, group):
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world_size))
        seen.append((op, tuple(ranks), tensor.numel() * tensor.element_size()))

    if make is None:
        lib, unit = UnitGather(False, new_subgroups(None, g)), _Unit(truth[0][rank * s:(rank + 1) * s].clone(), world_size)
    else:
        obj = make(truth[0][rank * s:(rank + 1) * s].clone(), g)
    rows, secondary = [], []
    for step in range(steps):
        for phase in ("forward", "backward"):
            seen.clear()
            with comm.hooked(hook):
                if make is None:
                    lib.gather(unit)
                    full = unit.full.clone()
                    lib.keep_secondary(unit)
                else:
                    full = obj.gather()
                    got = full.clone()
                    obj.release(full)
                    full.fill_(float("nan"))                 # released: a kept view would read NaN later
                    full = got
            rows.append(dict(phase=phase, step=step, collectives=list(seen),
                             values=bool(full.shape == truth[step].shape and torch.equal(full, truth[step]))))
            if phase == "forward":
                kept = lib.secondary if make is None else getattr(obj, "secondary", None)
                secondary.append(None if kept is None else kept.numel())
        new = truth[step + 1][rank * s:(rank + 1) * s].clone() if step + 1 < steps else None
        if new is not None:
            if make is None:
                unit.part = new
                lib.invalidate()
            else:
                obj.step(new)
    return dict(rows=rows, secondary=secondary)


def hpz_exercise(rank, world_size, make, unit_numel, g):
    """Task 5.4 on one launch: (the student's schedule, the library's) on this rank."""
    return hpz_schedule(rank, world_size, make, unit_numel, g), hpz_schedule(rank, world_size, None, unit_numel, g)
