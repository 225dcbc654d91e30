"""Sharded, atomic checkpoints of a ZeRO engine, readable at any data-parallel size and stage.

``engine.save_checkpoint(dir, tag)`` and ``engine.load_checkpoint(dir, tag)`` call ``save`` and ``load``.
A checkpoint is a folder ``<dir>/<tag>/``; ``<dir>/latest`` holds the newest tag (DeepSpeed's convention):

    metadata.json                   stage, world size, version, every parameter's shape, which file holds
                                    which elements of which parameter, each file's size     (rank 0)
    model_states.pt                 client_state, counters, loss scaler, lr scheduler, Adam's settings,
                                    buffers; the full module state dict for stages 0-2    (rank 0)
    optim_states_rank{r:03d}.pt     rank r's fp32 master weights, exp_avg, exp_avg_sq (a client optimizer's
                                    per-element state instead of the moments), and its torch RNG state
                                    (restored only with ``load_rng_state=True``)          (every rank)
    param_states_rank{r:03d}.pt     rank r's partition of the (16-bit) parameters        (stage 3)

States are stored per *parameter* as ``{name: {"start": i, "master": t, ...}}``: the flat elements
[i, i + len(t)) of that parameter. Rank r writes the pieces of its shard of every bucket (stage 0 the
pieces it would own if it were sharded), so each rank writes 12Ψ/N bytes of optimizer state at every
stage. Nothing in the files depends on the bucket layout, the world size or the stage: ``load`` asks,
for each piece *its* layout gives this rank, which files overlap it (``metadata.json``'s index) and
copies those elements. So a checkpoint saved at N ranks loads at M ranks, and at any stage.

Atomic: every rank writes into ``<dir>/.<tag>.tmp-<nonce>`` (fsync'd); the ranks agree that all
files are complete; only then rank 0 renames the folder to ``<dir>/<tag>`` and replaces ``latest``
(written aside, then ``os.replace``). A crash at any point before the rename leaves the previous
checkpoint and ``latest`` as they were; a stale ``.tmp`` folder is removed by the next save.
Safe to load: files are read with ``torch.load(weights_only=True)``, which refuses any pickled object
that is not a tensor or a plain container, so a checkpoint cannot run code (``CheckpointError``).
Reading needs no engine: ``zero_ref.checkpoint.format`` holds the reader and consolidates any checkpoint
into one fp32 state dict (``python -m zero_ref.ds.utils.zero_to_fp32``).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import warnings

import torch

from zero_ref import comm
from zero_ref.stages.param_groups import HYPERPARAMETERS
from zero_ref.stages.zero3.unit import unit_of
from zero_ref.checkpoint.format import (CLIENT, FORMAT, LATEST, META, MODEL, STATES, CheckpointError, Reader, numel,
                                        optim_file, param_file, resolve)

__all__ = ["save", "load", "commit"]


# ---------------------------------------------------------------- what a rank owns
def _names(module) -> dict[int, str]:
    return {id(p): n for n, p in module.named_parameters()}  # a tied weight under its first name


def _owned(opt, b, names: dict, ranks) -> list[tuple[str, int, int, int]]:
    """(parameter, first element, end, offset in the rank's state tensor) for ``ranks``' shards of ``b``;
    stage 0's state tensors are the whole padded bucket, so its offsets start at the shard."""
    out = []
    for r in ranks:
        base = b.layout.shard_range(r)[0] if opt.stage == 0 else 0
        out += [(names[id(b.params[pc.index])], pc.param_start, pc.param_end, base + pc.shard_start)
                for pc in b.layout.pieces(r)]
    return out


def _read_states(opt) -> list[dict[str, torch.Tensor]]:
    """Every bucket's optimizer state by name: master, exp_avg, exp_avg_sq (the live tensors, or copies read
    from NVMe); with a client optimizer the master and copies of that optimizer's per-element state."""
    off = opt.offload
    if opt.client is not None:
        return [{"master": b.partition.master,
                 **{CLIENT + k: t for k, t in opt.client.flat_state(i, b.partition.numel).items()}}
                for i, b in enumerate(opt.buckets)]
    if off is None or not off.nvme:
        return [dict(zip(STATES, (b.partition.master, b.partition.exp_avg, b.partition.exp_avg_sq)))
                for b in opt.buckets]
    where = {}
    for i, group in enumerate(off.sub_groups):
        buf = torch.empty(3 * off.swapper.numels[i])
        off.store.read(off.swapper.key(i), buf).result()
        views, at = buf.view(3, -1), 0
        for b in group:
            where[id(b)] = dict(zip(STATES, (v[at:at + b.layout.shard_numel] for v in views)))
            at += b.layout.shard_numel
    return [where[id(b)] for b in opt.buckets]


def _client_states(reader: Reader) -> tuple[list[str], list[dict]]:
    """A client optimizer's saved per-element state names, and per param group the values a whole tensor
    shares, the first rank's that has them."""
    keys, shared = set(), []
    for r in range(reader.meta["world_size"]):
        d = reader.load(optim_file(r))
        keys |= {k for piece in d["pieces"].values() for k in piece if k.startswith(CLIENT)}
        for i, values in enumerate(d.get("client_shared", [])):
            if i == len(shared):
                shared.append({})
            shared[i] = shared[i] or values
    return sorted(keys), shared


def _write_states(opt, states: list[dict[str, torch.Tensor]]) -> None:
    """Make ``states`` (from ``_read_states``, edited in place) the optimizer's: NVMe commits a new version."""
    off = opt.offload
    if off is None or not off.nvme:
        return
    of = dict(zip(map(id, opt.buckets), states))
    off.store.begin()
    for i, group in enumerate(off.sub_groups):
        off.swapper.write_initial(i, [torch.cat([of[id(b)][k] for b in group]) for k in STATES])
    off.store.commit()


def _shapes(module) -> dict[str, torch.Size]:
    """Every parameter's shape, also while ZeRO-3 has partitioned it (``param.data`` is then empty)."""
    out = {}
    for n, p in module.named_parameters():
        u = unit_of(p)
        out[n] = next(s for q, s in zip(u.params, u.layout.shapes) if q is p) if u is not None else p.shape
    return out


def _copy(t: torch.Tensor) -> torch.Tensor:
    # A slice saved as is would drag its whole storage (the full flat buffer) into the file.
    return t.detach().to("cpu", copy=True)


def _state_keys(module, prefix: str = "") -> list[str]:
    """module.state_dict()'s keys in its order, without calling it (ZeRO-3 forbids that while partitioned)."""
    keys = [prefix + n for n, p in module._parameters.items() if p is not None]
    keys += [prefix + n for n, b in module._buffers.items() if b is not None and n not in module._non_persistent_buffers_set]
    for n, child in module._modules.items():
        if child is not None:
            keys += _state_keys(child, prefix + n + ".")
    return keys


# ---------------------------------------------------------------- save
def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_file(obj, path: str) -> int:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return os.path.getsize(path)


def _check_loadable(obj, what: str) -> None:
    """Refuse now what ``load`` would refuse later: anything weights_only loading cannot read."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    try:
        torch.load(buf, weights_only=True)
    except pickle.UnpicklingError as e:
        raise TypeError(f"{what} holds an object a safe load refuses ({str(e).strip().splitlines()[-1]}); keep it "
                        "to tensors, numbers, strings, lists, tuples and dicts") from None


def _rank0(group) -> int:
    return torch.distributed.get_global_rank(group, 0) if group is not None else 0


def _shard_files(opt, names: dict) -> dict[str, dict]:
    """What this rank writes: its pieces of the optimizer states (and, in stage 3, of the parameters)."""
    rank, pieces = opt.rank, {}
    for b, st in zip(opt.buckets, _read_states(opt)):
        for name, lo, hi, at in _owned(opt, b, names, [rank]):
            pieces[name] = {"start": lo, **{k: _copy(t[at:at + hi - lo]) for k, t in st.items()}}
    rng = {"cpu": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_available() else {})}
    files = {optim_file(rank): {"rank": rank, "pieces": pieces, "rng": rng}}
    if opt.client is not None:  # the values a whole tensor shares (a step count), per param group
        files[optim_file(rank)]["client_shared"] = opt.client.shared_state()
    if opt.stage == 3:
        pieces = {}
        for u in opt.units:
            part = u.unit.device_part()
            for pc in u.layout.pieces(rank):
                pieces[names[id(u.params[pc.index])]] = {
                    "start": pc.param_start, "param": _copy(part[pc.shard_start:pc.shard_start + pc.numel])}
        files[param_file(rank)] = {"rank": rank, "pieces": pieces}
    return files


def save(engine, save_dir: str, tag=None, client_state: dict | None = None, save_latest: bool = True) -> str:
    """Every rank writes its shard; returns the checkpoint's folder. A collective: call it on every rank."""
    opt, module = engine.optimizer, engine.module
    rank, world, group = opt.rank, opt.world_size, opt.group
    tag = f"global_step{engine.global_steps}" if tag is None else str(tag)
    if not re.fullmatch(r"[\w][\w.+-]*", tag) or tag == LATEST:
        raise ValueError(f"checkpoint tag {tag!r} must be a plain file name (letters, digits, '_', '-', '.', '+')")
    if opt.micro_steps % opt.gas:
        raise CheckpointError(f"save_checkpoint after micro-step {opt.micro_steps}, inside an accumulation window of "
                              f"{opt.gas}: the accumulated gradients would be lost; save after engine.step() at a "
                              "boundary")
    _check_loadable(client_state or {}, "client_state")
    sched = engine.lr_scheduler.state_dict() if getattr(engine, "lr_scheduler", None) is not None else None
    _check_loadable(sched, "the lr scheduler's state_dict()")
    os.makedirs(save_dir, exist_ok=True)
    nonce = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        for stale in os.listdir(save_dir):  # left by a save that crashed
            if re.fullmatch(r"\..+\.(tmp|old)-[0-9a-f]+", stale):
                shutil.rmtree(os.path.join(save_dir, stale), ignore_errors=True)
        nonce[0] = int.from_bytes(os.urandom(6), "little")
    if world > 1:  # (also orders the clean-up above before anyone writes)
        comm.broadcast(nonce, src=_rank0(group), group=group)
    tmp = os.path.join(save_dir, f".{tag}.tmp-{int(nonce):012x}")
    names = _names(module)
    sizes, error = torch.zeros(2, dtype=torch.int64), None  # [optimizer file, parameter file] bytes; -1: failed
    try:
        os.makedirs(tmp, exist_ok=True)
        for i, (file, obj) in enumerate(_shard_files(opt, names).items()):
            sizes[i] = _save_file(obj, os.path.join(tmp, file))
        if rank == 0:
            _save_model_states(engine, os.path.join(tmp, MODEL), client_state, sched)
    except BaseException as e:  # the others must learn of it, or rank 0 would commit an incomplete checkpoint
        sizes[0], error = -1, e
    all_sizes = torch.zeros(2 * world, dtype=torch.int64)
    comm.all_gather(all_sizes, sizes, group=group) if world > 1 else all_sizes.copy_(sizes)
    all_sizes = all_sizes.view(world, 2).tolist()
    if failed := [r for r, s in enumerate(all_sizes) if s[0] < 0]:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"saving checkpoint {tag!r} failed on rank(s) {failed}; {save_dir} is unchanged") from error
    ok = torch.ones(1, dtype=torch.int64)
    if rank == 0:
        try:
            _write_metadata(engine, tmp, names, all_sizes)
            commit(save_dir, tmp, tag, save_latest)
        except BaseException as e:
            ok[0], error = 0, e
    if world > 1:
        comm.broadcast(ok, src=_rank0(group), group=group)
    if not ok[0]:
        raise CheckpointError(f"rank 0 could not commit checkpoint {tag!r} in {save_dir}") from error
    return os.path.join(save_dir, tag)


def _save_model_states(engine, path: str, client_state, sched) -> None:
    opt, module = engine.optimizer, engine.module
    if opt.stage == 3:  # parameters are partitioned: buffers only here, parameters in param_states_rank*.pt
        keys = set(_state_keys(module)) - {n for n, _ in module.named_parameters(remove_duplicate=False)}
        state = {k: _copy(v) for k, v in module.named_buffers(remove_duplicate=False) if k in keys}
    else:
        state, copies = {}, {}  # a tied weight: one copy under both names, as in the module
        for k, v in module.state_dict(keep_vars=True).items():
            state[k] = copies[id(v)] if id(v) in copies else copies.setdefault(id(v), _copy(v))
    adam = opt.adam
    _save_file({
        "module": state, "client_state": client_state or {}, "lr_scheduler": sched,
        "loss_scaler": opt.loss_scaler.state_dict() if opt.loss_scaler is not None else None,
        "adam": {"lr": adam.lr, "betas": tuple(adam.betas), "eps": adam.eps, "weight_decay": adam.weight_decay,
                 "adamw": adam.adamw},
        "param_group_lrs": [[g["lr"] for g in h.param_groups] for h in _lr_holders(engine)],
        "param_groups": [_group_values(opt, g) for g in opt.param_groups],  # each group's own values
        "optimizer": _optimizer_kind(opt),
        "optimizer_steps": opt.adam_steps, "optimizer_skipped_steps": opt.skipped_steps,
        "global_steps": getattr(engine, "global_steps", opt.adam_steps),
        "engine": {k: getattr(engine, k) for k in ("global_samples", "skipped_steps") if hasattr(engine, k)},
    }, path)


def _optimizer_kind(opt) -> str:
    return "Adam" if opt.client is None else opt.client.name


def _group_values(opt, group: dict) -> dict:
    """A param group's hyper-parameters: Adam's four, or every plain value of a client optimizer's group."""
    if opt.client is None:
        return {k: group[k] for k in HYPERPARAMETERS}
    plain = (bool, int, float, str, type(None))
    return {k: v for k, v in group.items() if k != "params" and (isinstance(v, plain) or (
        isinstance(v, (tuple, list)) and all(isinstance(x, plain) for x in v)))}


def _lr_holders(engine) -> list:
    """Whatever holds the learning rate a schedule wrote (torch's param_groups): DeepSpeed restores it too."""
    return [h for h in (engine.optimizer, getattr(engine, "client_optimizer", None)) if hasattr(h, "param_groups")]


def _write_metadata(engine, tmp: str, names: dict, all_sizes: list) -> None:
    opt, module, world = engine.optimizer, engine.module, engine.optimizer.world_size
    shapes = _shapes(module)
    params = {n: {"shape": list(shapes[n]), "dtype": str(p.dtype).replace("torch.", ""), "trainable": p.requires_grad}
              for n, p in module.named_parameters()}
    optim_index = {optim_file(r): [list(x[:3]) for b in opt.buckets for x in _owned(opt, b, names, [r])]
                   for r in range(world)}
    if opt.stage == 3:
        param_index = {param_file(r): [[names[id(u.params[pc.index])], pc.param_start, pc.param_end]
                                       for u in opt.units for pc in u.layout.pieces(r)] for r in range(world)}
    else:
        param_index = {MODEL: [[n, 0, numel(p["shape"])] for n, p in params.items()]}
    sizes = {optim_file(r): s[0] for r, s in enumerate(all_sizes)}
    sizes.update({param_file(r): s[1] for r, s in enumerate(all_sizes) if opt.stage == 3})
    sizes[MODEL] = os.path.getsize(os.path.join(tmp, MODEL))
    from importlib.metadata import PackageNotFoundError, version
    try:
        ver = version("zero-lab")
    except PackageNotFoundError:
        ver = "unknown"
    meta = {"format": FORMAT, "zero_ref_version": ver, "stage": opt.stage, "world_size": world,
            "precision": opt.precision, "global_steps": getattr(engine, "global_steps", opt.adam_steps),
            "params": params, "state_dict_keys": _state_keys(module),
            "aliases": {n: names[id(p)] for n, p in module.named_parameters(remove_duplicate=False) if names[id(p)] != n},
            "index": {"optim": optim_index, "param": param_index}, "file_bytes": sizes}
    with open(os.path.join(tmp, META), "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)


def commit(save_dir: str, tmp: str, tag: str, save_latest: bool) -> None:
    final, old = os.path.join(save_dir, tag), None
    if os.path.exists(final):  # re-saving a tag: move the old one aside first (a directory cannot be replaced)
        old = tmp.replace(".tmp-", ".old-")
        os.rename(final, old)
    os.rename(tmp, final)  # the commit point
    if save_latest:
        with open(os.path.join(save_dir, ".latest.tmp"), "w") as f:
            f.write(tag)
            f.flush()
            os.fsync(f.fileno())
        os.replace(os.path.join(save_dir, ".latest.tmp"), os.path.join(save_dir, LATEST))
    _fsync_dir(save_dir)
    if old:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- load
def _check_model(meta: dict, module, path: str, optimizer_states: bool) -> None:
    have, shapes, ckpt = dict(module.named_parameters()), _shapes(module), meta["params"]
    if set(have) != set(ckpt):
        raise CheckpointError(f"{path} is for another model: parameters only in the checkpoint "
                              f"{sorted(set(ckpt) - set(have))}, only in the model {sorted(set(have) - set(ckpt))}")
    for n, p in have.items():
        shape = tuple(shapes[n])
        if shape != tuple(ckpt[n]["shape"]):
            raise CheckpointError(f"parameter '{n}': the checkpoint has shape {tuple(ckpt[n]['shape'])}, the model "
                                  f"{shape}")
        if optimizer_states and p.requires_grad and not ckpt[n]["trainable"]:
            raise CheckpointError(f"parameter '{n}' is trainable but was frozen when {path} was saved: it has no "
                                  "optimizer state (load with load_optimizer_states=False)")


def load(engine, load_dir: str, tag=None, load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
         load_rng_state: bool = False):
    """Load a checkpoint saved at any world size and stage; returns (path, client_state), or (None, None)
    when ``tag`` is None and ``load_dir`` has no ``latest`` (DeepSpeed's return). Call it on every rank.

    The torch RNG is left as it is, as DeepSpeed's ``load_checkpoint`` leaves it (it saves none): after a
    resume the script draws what it draws under DeepSpeed. ``load_rng_state=True`` restores the rank's
    CPU (and CUDA) RNG state saved with the checkpoint, so dropout masks continue the saved stream; it
    needs the world size the checkpoint was saved at (rank r's stream is rank r's)."""
    path = resolve(load_dir, tag)
    if path is None:
        if engine.optimizer.rank == 0:
            warnings.warn(f"no '{LATEST}' file in {load_dir}: nothing loaded")
        return None, None
    opt, module = engine.optimizer, engine.module
    reader = Reader(path)
    meta = reader.meta
    _check_model(meta, module, path, load_optimizer_states)
    if load_rng_state and meta["world_size"] != engine.optimizer.world_size:
        raise CheckpointError(f"load_rng_state=True: {path} holds the RNG states of {meta['world_size']} ranks, this "
                              f"run has {engine.optimizer.world_size}; each rank's stream belongs to its rank, so "
                              "load at the saved world size or without load_rng_state")
    names, rank = _names(module), opt.rank
    states = reader.load(MODEL)
    saved_groups = len(states.get("param_groups", opt.param_groups))
    saved_kind = states.get("optimizer", "Adam")
    if load_optimizer_states and saved_kind != _optimizer_kind(opt):
        raise CheckpointError(f"{path} holds {saved_kind}'s optimizer state, this engine steps {_optimizer_kind(opt)}: "
                              "build it with the optimizer it was saved with (or load with load_optimizer_states=False)")
    if load_optimizer_states and saved_groups != len(opt.param_groups):
        raise CheckpointError(f"{path} was saved with {saved_groups} param groups, the optimizer has "
                              f"{len(opt.param_groups)}: build the engine with the groups it was saved with "
                              "(or load with load_optimizer_states=False)")
    with torch.no_grad():
        if opt.stage == 3:
            for u in (s.unit for s in opt.units):
                part = torch.empty(u.layout.shard_numel, dtype=u.part.dtype).zero_()
                for pc in u.layout.pieces(rank):
                    part[pc.shard_start:pc.shard_start + pc.numel] = \
                        reader.read(names[id(u.params[pc.index])], "param", pc.param_start, pc.param_end)
                u.offload.write_part(u, part) if u.offload is not None else u.part.copy_(part)
                if u.full is not None:  # a persistent unit: gather the new values
                    u.release()
                    u.gather()
        else:
            for n, p in module.named_parameters():
                p.data.copy_(reader.read(n, "param").view(p.shape))
        buffers = dict(module.named_buffers(remove_duplicate=False))
        for k, v in states["module"].items():
            if k in buffers:
                buffers[k].copy_(v)
        live = _read_states(opt)
        client_keys, shared = _client_states(reader) if opt.client is not None and load_optimizer_states else ([], [])
        for i, (b, st) in enumerate(zip(opt.buckets, live)):
            if load_optimizer_states:
                if opt.client is not None:  # exactly the saved state: what this optimizer holds now is replaced
                    st = live[i] = {"master": st["master"],
                                    **{k: torch.zeros(b.partition.numel, dtype=torch.float32) for k in client_keys}}
                for name, lo, hi, at in _owned(opt, b, names, range(opt.world_size) if opt.stage == 0 else [rank]):
                    for k, t in st.items():
                        t[at:at + hi - lo] = reader.read(name, k, lo, hi)
            else:  # fresh moments stay; the master weights follow the loaded parameters
                src = b.unit.device_part() if opt.stage == 3 else b.flat_param if opt.stage == 0 else b.shard(b.flat_param)
                if st["master"].data_ptr() != src.data_ptr():
                    st["master"].copy_(src)
        _write_states(opt, live)
        if opt.client is not None and load_optimizer_states:
            for i, st in enumerate(live):
                opt.client.load_state(i, {k[len(CLIENT):]: t for k, t in st.items() if k.startswith(CLIENT)}, shared)
    if load_optimizer_states:
        for k, v in states["adam"].items():
            setattr(opt.adam, k, tuple(v) if k == "betas" else v)
        for group, values in zip(opt.param_groups, states.get("param_groups", [])):
            group.update({k: tuple(v) if k == "betas" else v for k, v in values.items()})
        opt.adam_steps, opt.skipped_steps = states["optimizer_steps"], states["optimizer_skipped_steps"]
        if opt.loss_scaler is not None and states["loss_scaler"] is not None:
            opt.loss_scaler.load_state_dict(states["loss_scaler"])
    if load_rng_state:  # this rank's random stream (dropout masks) continues where the save left it
        rng = reader.load(optim_file(rank))["rng"]
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    schedule = load_lr_scheduler_states and getattr(engine, "lr_scheduler", None) is not None and states["lr_scheduler"]
    if schedule:
        engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
    holders = _lr_holders(engine)  # the rate the schedule last wrote: with the optimizer, or with the schedule
    if (load_optimizer_states or schedule) and [len(h.param_groups) for h in holders] == \
            [len(x) for x in states["param_group_lrs"]]:
        for h, lrs in zip(holders, states["param_group_lrs"]):
            for g, lr in zip(h.param_groups, lrs):
                g["lr"] = lr
    for k, v in {"global_steps": states["global_steps"], **states["engine"]}.items():
        if hasattr(engine, k):
            setattr(engine, k, v)
    # the micro-step count an uninterrupted run would have now (at this gradient accumulation), on both
    opt.micro_steps = states["global_steps"] * opt.gas
    if hasattr(engine, "micro_steps"):
        engine.micro_steps = opt.micro_steps
    return path, states["client_state"]
