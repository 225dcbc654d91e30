"""DeepSpeed's ``PipelineModule``: a model written as a list of layers, cut into pipeline stages.

    layers = [LayerSpec(nn.Linear, 16, 32), nn.ReLU(), TiedLayerSpec("emb", Embedding, ...), ...]
    net = PipelineModule(layers=layers, num_stages=2, loss_fn=nn.MSELoss(), partition_method="parameters")
    engine, *_ = zero_ref.initialize(model=net, config=ds_config)   # a PipelineEngine
    loss = engine.train_batch(data_iter)

Every rank builds only its own stage's layers, as DeepSpeed does (a ``LayerSpec`` is a class and its
arguments, built where it lands), with the same ranks, the same split and the same random numbers
spent in the same order, so that a seeded script starts from the same weights under either engine:

- ranks: DeepSpeed's ``PipeDataParallelTopology`` (axes pipe, data): global rank = stage · dp + dp rank;
- the split (``_partition_layers``): ``"uniform"`` (equal layer counts), ``"parameters"`` (trainable
  parameter counts; each ``LayerSpec`` is built once to count them, which draws random numbers before
  the real build, as in DeepSpeed) or ``"type:regex"`` (layers whose class name matches), balanced by
  DeepSpeed's ``partition_balanced`` — which minimises the *spread* (largest − smallest stage), not the
  largest stage as ``zero_ref.parallel.partition`` does, so the two can cut differently;
- tied layers (``TiedLayerSpec(key, ...)``): one module per stage holding the key; its weight is
  broadcast from the lowest such rank, and its gradients summed over them after every batch
  (``allreduce_tied_weight_gradients``).

Simplified vs DeepSpeed: no ``topology=`` other than pipe × data, no ``seed_layers``, no activation
checkpointing inside the module, and a layer's output is one tensor (DeepSpeed also passes tuples).
"""
from __future__ import annotations

import re
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn

from zero_ref import comm

__all__ = ["LayerSpec", "TiedLayerSpec", "PipelineModule", "partition_uniform", "partition_balanced"]


class LayerSpec:
    """A layer to build later: its class and arguments (built only on the stage that holds it)."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise TypeError(f"LayerSpec: typename must be a torch.nn.Module class, got {typename!r}")
        self.typename, self.module_args, self.module_kwargs = typename, module_args, module_kwargs

    def build(self) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.typename.__name__})"


class TiedLayerSpec(LayerSpec):
    """A layer whose weights are shared by every place the same ``key`` appears (e.g. the input
    embedding and the output head); ``forward_fn(module, x)`` overrides the module's forward there."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr=("weight",), **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key, self.forward_fn = key, forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Stage boundaries [0, ..., num_items] with equal counts, the first stages taking the remainder."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, rest = divmod(num_items, num_parts)
    return [p * size + min(p, rest) for p in range(num_parts + 1)]


def partition_balanced(weights: list[float], num_parts: int) -> list[int]:
    """DeepSpeed's split (runtime/utils.py ``partition_balanced``): contiguous parts minimising
    max − min of the part weights, dynamic programming; on a tie the later cut wins, as there."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    hi = [[inf] * (m + 1) for _ in range(n + 1)]
    lo = [[inf] * (m + 1) for _ in range(n + 1)]
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    cut = [[0] * (m + 1) for _ in range(n + 1)]
    hi[0][0] = cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                a, b = max(hi[k][j - 1], part), min(lo[k][j - 1], part)
                if cost[i][j] >= a - b:
                    cost[i][j], hi[i][j], lo[i][j], cut[i][j] = a - b, a, b, k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(cut[parts[-1]][j])
    return parts[::-1]


class PipelineModule(nn.Module):
    """This rank's stage of a layer list (DeepSpeed's signature; see the module docstring)."""

    def __init__(self, layers, num_stages=None, topology=None, loss_fn=None, seed_layers=False, seed_fn=None,
                 base_seed=1234, partition_method="parameters", activation_checkpoint_interval=0,
                 activation_checkpoint_func=None, checkpointable_layers=None, dynamic_shape=False):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("PipelineModule: torch.distributed is not initialized; call zero_ref.init_distributed() "
                               "first (DeepSpeed needs deepspeed.init_distributed() here too)")
        if topology is not None or seed_layers or activation_checkpoint_interval:
            raise ValueError("PipelineModule: topology=, seed_layers=True and activation_checkpoint_interval are not "
                             "supported by zero_ref (the ranks are pipe × data, as DeepSpeed's default topology)")
        if num_stages is None:
            raise ValueError("PipelineModule: give num_stages (DeepSpeed: 'must provide num_stages or topology')")
        world = dist.get_world_size()
        if world % num_stages:
            raise ValueError(f"PipelineModule: num_stages ({num_stages}) must divide the world size ({world})")
        self.num_stages, self.loss_fn = num_stages, loss_fn
        self.global_rank = dist.get_rank()
        self.dp_world_size = world // num_stages
        self.stage_id, self.dp_id = divmod(self.global_rank, self.dp_world_size)
        # one group per axis; every rank creates every group, in the same order
        self.dp_group = self.pp_group = None
        for s in range(num_stages):
            g = dist.new_group([s * self.dp_world_size + d for d in range(self.dp_world_size)])
            self.dp_group = g if s == self.stage_id else self.dp_group
        self.pp_ranks = [s * self.dp_world_size + self.dp_id for s in range(num_stages)]
        for d in range(self.dp_world_size):
            g = dist.new_group([s * self.dp_world_size + d for s in range(num_stages)])
            self.pp_group = g if d == self.dp_id else self.pp_group
        self._layer_specs = list(layers)
        self.parts = self._partition(partition_method.lower())
        self._start, self._stop = self.parts[self.stage_id], self.parts[self.stage_id + 1]
        if self._start == self._stop:
            raise ValueError(f"PipelineModule: stage {self.stage_id} got no layer ({len(self._layer_specs)} layers "
                             f"over {num_stages} stages, split {self.parts})")
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: dict[str, list[str]] = {}
        self.forward_funcs = []
        self._build()
        self.tied_comms = self._index_tied_modules()
        with torch.no_grad():
            for key, (group, src) in self.tied_comms.items():
                for w in self._tied_weights(key):
                    comm.broadcast(w.data, src=src, group=group)

    # ------------------------------------------------------------ building
    def _partition(self, method: str) -> list[int]:
        n, p = len(self._layer_specs), self.num_stages
        if method == "uniform":
            return partition_uniform(n, p)
        if method == "parameters":
            counts = []
            for layer in self._layer_specs:  # built once to count, as DeepSpeed's _count_layer_params does
                m = layer.build() if isinstance(layer, LayerSpec) else layer if isinstance(layer, nn.Module) else None
                counts.append(0 if m is None else sum(q.numel() for q in m.parameters() if q.requires_grad))
            return partition_balanced(counts, p)
        if method.startswith("type:"):
            pattern = re.compile(method.split(":", 1)[1], re.IGNORECASE)
            names = [s.typename.__name__ if isinstance(s, LayerSpec) else type(s).__name__ if isinstance(s, nn.Module)
                     else getattr(s, "__name__", "") for s in self._layer_specs]
            weights = [1 if pattern.search(name) else 0 for name in names]
            if not any(weights):  # (DeepSpeed raises too: "found no valid layers to partition")
                raise ValueError(f"PipelineModule: partition_method={method!r} matches none of the layers {names}")
            return partition_balanced(weights, p)
        raise ValueError(f"PipelineModule: partition_method={method!r} is not supported; use 'parameters', "
                         "'uniform' or 'type:<regex>' (DeepSpeed has no other either: 'profile' raises there)")

    def _build(self) -> None:
        for idx in range(self._start, self._stop):
            layer = self._layer_specs[idx]
            if isinstance(layer, TiedLayerSpec):
                if layer.key not in self.tied_modules:
                    self.tied_modules[layer.key] = layer.build()
                    self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
                module = self.tied_modules[layer.key]
                self.forward_funcs.append(module if layer.forward_fn is None else partial(layer.forward_fn, module))
            elif isinstance(layer, LayerSpec):
                module = layer.build()
                self.add_module(str(idx), module)
                self.forward_funcs.append(module)
            elif isinstance(layer, nn.Module):
                self.add_module(str(idx), layer)
                self.forward_funcs.append(layer)
            elif callable(layer):  # a plain function (e.g. a reshape) between layers
                self.forward_funcs.append(layer)
            else:
                raise TypeError(f"PipelineModule: layer {idx} is {type(layer).__name__}; give a LayerSpec, an "
                                "nn.Module or a callable")

    def _index_tied_modules(self) -> dict:
        """{key: (group of the ranks holding it in this data-parallel column, lowest of them)}."""
        out = {}
        if self.num_stages == 1:
            return out
        keys = sorted({s.key for s in self._layer_specs if isinstance(s, TiedLayerSpec)})
        for key in keys:
            stages = sorted({self.stage_owner(i) for i, s in enumerate(self._layer_specs)
                             if isinstance(s, TiedLayerSpec) and s.key == key})
            for d in range(self.dp_world_size):  # every rank creates every group
                ranks = [s * self.dp_world_size + d for s in stages]
                group = dist.new_group(ranks)
                if self.global_rank in ranks:
                    out[key] = (group, ranks[0])
        return out

    def _tied_weights(self, key: str) -> list[torch.Tensor]:
        out = []
        for attr in self.tied_weight_attrs[key]:
            w = self.tied_modules[key]
            for part in attr.split("."):
                w = getattr(w, part)
            out.append(w)
        return out

    def allreduce_tied_weight_gradients(self) -> None:
        """Sum the tied weights' gradients over the stages that share them."""
        for key, (group, _) in self.tied_comms.items():
            for w in self._tied_weights(key):
                if w.grad is None:
                    w.grad = torch.zeros_like(w)
                comm.all_reduce(w.grad, group=group)

    def stage_owner(self, layer_idx: int) -> int:
        for s in range(self.num_stages):
            if self.parts[s] <= layer_idx < self.parts[s + 1]:
                return s
        raise ValueError(f"PipelineModule: layer {layer_idx} is outside 0..{len(self._layer_specs) - 1}")

    # ------------------------------------------------------------ running
    def forward(self, x):
        """This stage's layers, in order."""
        for f in self.forward_funcs:
            x = f(x)
        return x

    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1
