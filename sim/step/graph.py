"""The task graph of one training step, for one representative rank per pipeline stage.

TP and DP replicas of a stage do the same work at the same time, so one rank per stage stands for
them all and a collective is a single node whose duration comes from the cost model. Nodes are
created in a topological order, each on one stream of its stage; a stream runs its nodes in
creation order. A node holds *work* (sim.cost.work: FLOPs or bytes), not seconds, so one graph can
be re-timed for other hardware. Each node may carry memory deltas (category, tier, bytes) applied
at its start or end. sim.step.lowering builds it from (model, plan).
"""
from __future__ import annotations

STREAMS = ("compute", "tp_comm", "dp_comm", "pp_comm", "h2d", "d2h", "nvme", "cpu", "cp_comm")
KINDS = ("forward", "backward", "tp_comm", "send_fwd", "send_bwd", "zero3_gather", "grad_reduce", "grad_norm",
         "optimizer", "param_gather", "cpu_adam", "h2d", "d2h", "nvme_read", "nvme_write",
         "attention", "cp_send", "cp_all_to_all", "weight_grad")
CATEGORIES = ("param", "grad", "optim", "activation", "zero3_gathered", "comm_bucket")
TIERS = ("gpu", "cpu", "nvme")
_S, _K, _C, _T = ({n: i for i, n in enumerate(x)} for x in (STREAMS, KINDS, CATEGORIES, TIERS))


class TaskGraph:
    """Struct-of-arrays task graph: per node kind, stream, stage, (micro-batch, chunk, group), work id, deps.

    ``works`` holds each distinct work item (sim.cost.work) once (``work[i]`` indexes it); memory deltas are
    parallel lists ``mem_node, mem_at_end, mem_cat, mem_tier, mem_bytes`` (bytes signed: + alloc).
    """

    def __init__(self, stages: int, virtual: int, group_layers: int, groups_per_chunk: int, *,
                 chunk_layers: list[int] | None = None, group_sizes: list[int] | None = None):
        self.stages, self.virtual = stages, virtual
        self.group_layers, self.groups_per_chunk = group_layers, groups_per_chunk  # the largest
        # per virtual stage (chunk c of stage s is c·stages + s): layers per group, its first layer
        n = stages * virtual
        chunk_layers = chunk_layers or [group_layers * groups_per_chunk] * n
        self.group_sizes = group_sizes or [group_layers] * n
        self.first_layer = [sum(chunk_layers[:k]) for k in range(n)]
        self.kind, self.stream, self.stage, self.mb, self.chunk, self.group, self.work = ([] for _ in range(7))
        self.works, self.deps, self._rows = [], [], []
        self._work_id: dict = {}
        self.mem_node, self.mem_at_end, self.mem_cat, self.mem_tier, self.mem_bytes = [], [], [], [], []
        self.last: dict[tuple[int, str], int] = {}  # (stage, stream) -> its latest node

    def __len__(self) -> int:
        return len(self.deps)

    def add(self, kind: str, stream: str, stage: int, work, deps=(), mb=-1, chunk=-1, group=-1) -> int:
        """Append a node (rows are turned into columns by ``finish``); returns its index."""
        w = self._work_id.get(work)
        if w is None:
            w = self._work_id[work] = len(self.works)
            self.works.append(work)
        i = len(self.deps)
        self._rows.append((_K[kind], _S[stream], stage, mb, chunk, group, w))
        self.deps.append(tuple(d for d in deps if d is not None))
        self.last[(stage, stream)] = i
        return i

    def finish(self) -> "TaskGraph":
        cols = list(zip(*self._rows)) if self._rows else [()] * 7
        self.kind, self.stream, self.stage, self.mb, self.chunk, self.group, self.work = map(list, cols)
        self._rows = []
        return self

    def mem(self, node: int, category: str, nbytes: float, *, at_end: bool = False, tier: str = "gpu") -> None:
        """Allocate (``nbytes`` > 0) or free (< 0) at the node's start, or its end when ``at_end``."""
        if nbytes:
            self.mem_node.append(node)
            self.mem_at_end.append(at_end)
            self.mem_cat.append(_C[category])
            self.mem_tier.append(_T[tier])
            self.mem_bytes.append(nbytes)


def node_name(graph: TaskGraph, i: int) -> str:
    """A readable name: 'F3 layers 0-5', 'B3.c1 layers 48-53', 'grad_reduce B7 layers 12-17', 'optimizer 0'."""
    kind, mb, chunk, grp = KINDS[graph.kind[i]], graph.mb[i], graph.chunk[i], graph.group[i]
    if mb < 0:
        return f"{kind} {grp}" if grp >= 0 else kind
    phase = ("F" if kind in ("forward", "send_fwd") else "B" if kind in ("backward", "send_bwd")
             else "W" if kind == "weight_grad" else "")
    op = f"{phase or 'mb'}{mb}" + (f".c{chunk}" if graph.virtual > 1 else "")
    if grp < 0:
        return f"{kind} {op}"
    vs = chunk * graph.stages + graph.stage[i]
    gl = graph.group_sizes[vs]
    first = graph.first_layer[vs] + grp * gl
    layers = f"layer {first}" if gl == 1 else f"layers {first}-{first + gl - 1}"
    return f"{op} {layers}" if phase else f"{kind} {op} {layers}"
