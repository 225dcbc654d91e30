"""The checkpoint format: file names, the index in ``metadata.json``, and reading it without an engine.

``Reader`` opens a checkpoint folder, loads files only with ``torch.load(weights_only=True)`` (a pickle
that would run code is refused) and memory-maps them, so reading a range of one parameter touches only
those bytes. ``checkpoint/sharded.py`` writes this format; this module is its reading half.

``get_fp32_state_dict_from_zero_checkpoint(dir, tag=None)`` returns what ``model.state_dict()`` of
the fp32 model would hold, whatever the stage and world size the checkpoint was saved at (DeepSpeed's
``zero_to_fp32.py`` does this for its own files): each trainable parameter assembled from the fp32
master pieces of every rank's optimizer file, frozen parameters and buffers cast to fp32, a tied
weight under each of its names. ``python -m zero_ref.ds.utils.zero_to_fp32`` is its command line.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import zipfile

import torch

FORMAT = 1
META, MODEL, LATEST = "metadata.json", "model_states.pt", "latest"
STATES = ("master", "exp_avg", "exp_avg_sq")
CLIENT = "client."  # a client optimizer's per-element state (SGD's momentum_buffer, Adagrad's sum): "client.<key>"


def optim_file(rank: int) -> str:
    return f"optim_states_rank{rank:03d}.pt"


def param_file(rank: int) -> str:
    return f"param_states_rank{rank:03d}.pt"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved or loaded (missing, incomplete, unsafe or for another model)."""


# ---------------------------------------------------------------- sizes and names
def checkpoint_bytes(num_params: int, *, zero_stage: int, dp: int, precision: str = "bf16",
                     mp: int = 1) -> dict[str, int]:
    """Tensor bytes a checkpoint of ``num_params`` trainable parameters holds (file framing aside).

    Every rank's optimizer file holds fp32 master, exp_avg and exp_avg_sq for about Ψ/N elements
    (12 bytes each; 12Ψ over all ranks) at every stage: stage 0's ranks hold all of it, and each writes
    one slice. Counted here as ⌈Ψ/N⌉ per rank: a bound per bucket at stages 0-2; at stage 3 each unit
    is padded on its own, so a rank may hold a few elements more. The parameters (2 bytes each in
    bf16/fp16, 4 in fp32) are rank 0's to write at stages 0-2, and ⌈Ψ/N⌉ per rank at stage 3. ``dp``: the ranks the states are divided over (TP × PP × DP under 3D).
    ``mp``: the model-parallel positions (TP × PP) among them; each holds its own 1/mp of the model,
    so under 3D ``rank0_params`` is what the first data-parallel rank of *each* position writes,
    ⌈Ψ/mp⌉ parameters (``ThreeD.save_checkpoint``: one folder per (tp, pp); DeepSpeed: one
    ``mp_rank_XX`` / ``layer_XX`` file per position)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    if dp < 1 or num_params < 0:
        raise ValueError(f"need dp >= 1 and num_params >= 0, got dp={dp}, num_params={num_params}")
    if mp < 1 or dp % mp:
        raise ValueError(f"mp (TP × PP) must be >= 1 and divide dp (all ranks), got mp={mp}, dp={dp}")
    shard, bp = -(-num_params // dp), 4 if precision == "fp32" else 2
    per_rank = bp * shard if zero_stage == 3 else 0
    rank0 = bp * -(-num_params // mp) if zero_stage < 3 else 0
    return {"optim_per_rank": 12 * shard, "params_per_rank": per_rank, "rank0_params": rank0,
            "largest_rank": 12 * shard + per_rank + rank0, "total": (12 + bp) * num_params}


def deepspeed_file_names(stage: int, world: int) -> list[str]:
    """The files DeepSpeed 0.19.8 writes into a tag folder for the same run (no tensor or pipeline
    parallelism), for comparison; tests/zero_ref/test_checkpoint.py checks them against a real DeepSpeed save.
    Beside the tag folders it writes ``latest`` and (stages 1-3) a copy of its ``zero_to_fp32.py`` script."""
    if stage == 3:
        return sorted(f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in range(world) for kind in ("model", "optim"))
    return ["mp_rank_00_model_states.pt"] + [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)
                                             if stage > 0]


# ---------------------------------------------------------------- read
def resolve(load_dir: str, tag=None) -> str | None:
    """The folder of checkpoint ``tag`` (``latest``'s when None; None when there is no ``latest``)."""
    if tag is None:
        latest = os.path.join(load_dir, LATEST)
        if not os.path.isfile(latest):
            return None
        with open(latest) as f:
            tag = f.read().strip()
    path = os.path.join(load_dir, str(tag))
    if not os.path.isdir(path):
        have = sorted(t for t in os.listdir(load_dir) if os.path.isdir(os.path.join(load_dir, t)) and t[0] != ".") \
            if os.path.isdir(load_dir) else []
        raise CheckpointError(f"no checkpoint {str(tag)!r} in {load_dir} (tags there: {have or 'none'})")
    return path


class Reader:
    """A checkpoint folder read safely: metadata, and any element range of any parameter's state."""

    def __init__(self, path: str):
        self.path, self._files = path, {}
        meta = os.path.join(path, META)
        if not os.path.isfile(meta):
            ds = any(f.endswith("model_states.pt") and f.startswith("mp_rank") for f in os.listdir(path))
            raise CheckpointError(f"{path} has no {META}" + (": it looks like a DeepSpeed checkpoint, which zero_ref "
                                  "does not read (DeepSpeed's zero_to_fp32.py converts it to a state dict)" if ds else ""))
        with open(meta) as f:
            self.meta = json.load(f)
        if self.meta.get("format") != FORMAT:
            raise CheckpointError(f"{meta}: checkpoint format {self.meta.get('format')!r}, this zero_ref reads {FORMAT}")
        self.where: dict[tuple, list] = {}  # (kind, name) -> [(start, end, file)]
        for kind, files in self.meta["index"].items():
            for file, entries in files.items():
                for name, lo, hi in entries:
                    self.where.setdefault((kind, name), []).append((lo, hi, file))

    def load(self, file: str):
        if file not in self._files:
            path = os.path.join(self.path, file)
            if not os.path.isfile(path):
                raise CheckpointError(f"checkpoint {self.path} is missing {file}")
            want = self.meta["file_bytes"].get(file)
            if want is not None and os.path.getsize(path) != want:
                raise CheckpointError(f"{path} is {os.path.getsize(path)} bytes; the checkpoint recorded {want} "
                                      "(truncated or replaced)")
            if not zipfile.is_zipfile(path):  # a bare pickle, or garbage: not something save() wrote
                raise CheckpointError(f"refused to load {path}: it is not a torch.save zip archive")
            try:
                self._files[file] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except pickle.UnpicklingError as e:
                raise CheckpointError(f"refused to load {path}: it holds pickled objects other than tensors and plain "
                                      f"containers, which could run code ({str(e).strip().splitlines()[-1]})") from None
            except RuntimeError as e:
                raise CheckpointError(f"cannot read {path}: {e}") from None
        return self._files[file]

    def state_bytes(self, file: str) -> int:
        """Bytes of parameter state ``file`` holds (its per-parameter pieces; the module's tensors in
        model_states.pt): the payload, without the zip and pickle framing or the random-number state."""
        d = self.load(file)
        tensors = d["module"].values() if file == MODEL else [t for p in d["pieces"].values() for k, t in p.items()
                                                              if k != "start"]
        unique = {t.untyped_storage().data_ptr(): t for t in tensors}.values()  # a tied weight is stored once
        return sum(t.numel() * t.element_size() for t in unique)

    def read(self, name: str, key: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Elements [lo, hi) of parameter ``name``'s flattened ``key`` ("param", one of STATES, or a client
        optimizer's ``CLIENT + key``)."""
        kind = "param" if key == "param" else "optim"
        hi = numel(self.meta["params"][name]["shape"]) if hi is None else hi
        parts, pos = [], lo
        for a, b, file in sorted(self.where.get((kind, name), [])):
            if b <= pos or a >= hi:
                continue
            if a > pos:
                break
            d = self.load(file)
            t = d["module"][name].reshape(-1) if file == MODEL else d["pieces"][name][key]
            parts.append(t[pos - a:min(b, hi) - a])
            pos = min(b, hi)
        if pos < hi:
            raise CheckpointError(f"{self.path} holds no {key} for elements [{pos}, {hi}) of '{name}'")
        return torch.cat(parts) if len(parts) > 1 else parts[0]


def numel(shape) -> int:
    return math.prod(shape)


# ---------------------------------------------------------------- consolidation
def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str, tag=None,
                                             exclude_frozen_parameters: bool = False) -> dict[str, torch.Tensor]:
    """The model's full fp32 state dict from checkpoint ``tag`` (``latest``'s when None) in ``checkpoint_dir``."""
    path = resolve(checkpoint_dir, tag)
    if path is None:
        raise CheckpointError(f"no '{LATEST}' file in {checkpoint_dir}: pass the tag of the checkpoint to read")
    reader = Reader(path)
    meta, buffers = reader.meta, reader.load(MODEL)["module"]
    out: dict[str, torch.Tensor] = {}
    for key in meta["state_dict_keys"]:
        name = meta["aliases"].get(key, key)
        p = meta["params"].get(name)
        if p is None:  # a buffer
            t = buffers[key]
            out[key] = t.to(torch.float32, copy=True) if t.is_floating_point() else t.clone()
        elif not (exclude_frozen_parameters and not p["trainable"]):
            if name not in out:
                t = reader.read(name, "master" if p["trainable"] else "param")
                out[name] = t.to(torch.float32, copy=True).view(p["shape"])
            out[key] = out[name]  # a tied weight: one tensor under both names, as in model.state_dict()
    return out


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir: str, output_file: str, tag=None,
                                               exclude_frozen_parameters: bool = False) -> dict:
    """Write the consolidated fp32 state dict to ``output_file`` (tensors only; ``.safetensors`` if asked)."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    if output_file.endswith(".safetensors"):
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise SystemExit("writing .safetensors needs the safetensors package (pip install safetensors)") from None
        seen: set = set()  # safetensors stores no shared tensors: a tied weight is written once per name
        save_file({k: v.clone() if v.data_ptr() in seen or seen.add(v.data_ptr()) else v for k, v in state.items()},
                  output_file)
    else:
        torch.save(state, output_file)
    return state


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir: str, tag=None) -> torch.nn.Module:
    """Load the consolidated fp32 weights into a plain (unpartitioned) ``model`` and return it (as DeepSpeed's)."""
    model.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag), strict=False)
    return model

