"""The task graph of one training step, for one representative rank per pipeline stage.

TP and DP replicas of a stage do the same work at the same time, so one rank per stage stands for
them all and a collective is a single node whose duration comes from the cost model. Nodes are
created in a topological order (``sim.pipeline.schedule_order``), each on one stream of its stage;
a stream runs its nodes in creation order. A node holds *work* (FLOPs or bytes, see
sim.cost.CostModel), not seconds, so one graph can be re-timed for other hardware.

Per micro-batch op (F or B of one model chunk on one stage) and layer group:

    [ZeRO-3: (NVMe read →) (H2D →) all-gather of the group: F one group ahead,
             B when the group's backward starts]                           dp_comm
    compute of the group                                                   compute
    TP collectives of the group (blocking: the next compute waits)         tp_comm
    B: gradient reduce per bucket (stage 0: all-reduce, 1–3: reduce-scatter;
       0–1 after the last micro-batch's backward, 2–3 after every one) (→ D2H when offloading)  dp_comm
then a send of the op's output to the neighbouring stage (pp_comm; each TP rank sends 1/t of it,
Megatron's scatter/gather). A compute node's work holds its FLOPs and the bytes of its element-wise
kernels (sim.cost.layer_elementwise_bytes). After the last op: an optional
global gradient-norm all-reduce, and the optimizer step in chunks: Adam on the GPU, or (NVMe read
→) CPU Adam (→ NVMe write) → H2D of the updated 16-bit parameters; stages 1–2 all-gather them.
Each node may carry memory deltas (category, tier, bytes) applied at its start or end.

ZeRO-3's gathers follow DeepSpeed's hooks: a module's parameters are fetched before its forward,
the next module's prefetched while it runs; in the backward (with activation checkpointing the
recomputed forward runs inside it) the fetch is issued when the module's backward starts and waits
behind the previous module's gradient reduce-scatter on the same stream, so gathers do not overlap
the backward's compute — what DeepSpeed #1170 ("the prefetching only partially overlaps with
computation", 2021) and PyTorch #70235 (FSDP's backward all-gathers "not triggered until current
layer's backward pass starts", queued behind reduce-scatters on one NCCL stream) describe, and
what Narayanan et al.'s ZeRO-3 times show (sim.calibrate). ``BACKWARD_GATHER`` switches it.

Parameters are spread evenly over the layers (Ψ/L each, embeddings included), as zero_ref.memory
splits Ψ evenly over tp·pp; the output head's FLOPs (2bshV) run on the last stage when ``head``.
"""
from __future__ import annotations

from zero_ref.memory import recipe
from sim.cost import head_forward_flops, layer_backward_flops, layer_elementwise_bytes, layer_forward_flops
from sim.pipeline import dependency, schedule_order

STREAMS = ("compute", "tp_comm", "dp_comm", "pp_comm", "h2d", "d2h", "nvme", "cpu")
KINDS = ("forward", "backward", "tp_comm", "send_fwd", "send_bwd", "zero3_gather", "grad_reduce", "grad_norm",
         "optimizer", "param_gather", "cpu_adam", "h2d", "d2h", "nvme_read", "nvme_write")
CATEGORIES = ("param", "grad", "optim", "activation", "zero3_gathered", "comm_bucket")
TIERS = ("gpu", "cpu", "nvme")
MAX_NODES = 300_000
# ZeRO-3's backward gathers: "on_demand" (issued when a group's backward starts, behind the previous
# reduce-scatter on the one DP stream: DeepSpeed as Narayanan et al. ran it, see the module
# docstring) or "prefetch" (one group ahead, like the forward's).
BACKWARD_GATHER = "on_demand"  # 'auto' granularity folds layers until the graph is at most this big
_S, _K, _C, _T = ({n: i for i, n in enumerate(x)} for x in (STREAMS, KINDS, CATEGORIES, TIERS))


class TaskGraph:
    """Struct-of-arrays task graph: per node kind, stream, stage, (micro-batch, chunk, group), work id, deps.

    ``works`` holds each distinct work tuple once (``work[i]`` indexes it); memory deltas are
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
        self._work_id: dict[tuple, int] = {}
        self.mem_node, self.mem_at_end, self.mem_cat, self.mem_tier, self.mem_bytes = [], [], [], [], []
        self.last: dict[tuple[int, str], int] = {}  # (stage, stream) -> its latest node

    def __len__(self) -> int:
        return len(self.deps)

    def add(self, kind: str, stream: str, stage: int, work: tuple, deps=(), mb=-1, chunk=-1, group=-1) -> int:
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
            self.mem_node.append(node); self.mem_at_end.append(at_end); self.mem_cat.append(_C[category])
            self.mem_tier.append(_T[tier]); self.mem_bytes.append(nbytes)


def layer_split(layers: int, chunks: int) -> list[int]:
    """Layers of each of ``chunks`` virtual stages: equal when ``chunks`` divides ``layers``, else
    ⌈layers/chunks⌉ each with the shortfall taken a layer at a time from the last and the first
    virtual stage inwards, where the output layer and the embedding sit (Megatron-DeepSpeed's
    partition that counts them as layers: BLOOM's 70 layers on 12 stages are 5, 6, …, 6, 5)."""
    if layers < chunks:
        raise ValueError(f"Model.layers {layers} must be at least Plan.pp × Plan.virtual = {chunks}")
    base = -(-layers // chunks)
    sizes = [base] * chunks
    ends = [k for pair in zip(range(chunks - 1, -1, -1), range(chunks)) for k in pair]
    for k in ends[:base * chunks - layers]:
        sizes[k] -= 1
    return sizes


def _group_sizes(granularity, sizes: list[int], ops: int, nodes_per_group: int) -> list[int]:
    """Layers per graph node in each virtual stage (see build_graph's ``granularity``)."""
    if granularity == "layer":
        return [1] * len(sizes)
    if granularity == "stage":
        return list(sizes)
    if isinstance(granularity, int) and not isinstance(granularity, bool):
        if granularity < 1 or any(n % granularity for n in sizes):
            raise ValueError(f"granularity {granularity} must divide the layers of every model chunk "
                             f"({sorted(set(sizes))})")
        return [granularity] * len(sizes)
    if granularity != "auto":
        raise ValueError(f"granularity must be 'auto', 'layer', 'stage' or a layer count, got {granularity!r}")
    for g in range(1, max(sizes) + 1):  # the finest split that keeps the graph small
        if all(n % g == 0 for n in sizes) and ops * (max(sizes) // g) * nodes_per_group <= MAX_NODES:
            return [g] * len(sizes)
    return list(sizes)


class _Lowering:
    """Builds the TaskGraph of (model, plan); one method per piece of the step."""

    def __init__(self, model, plan, granularity, head: bool):
        p, v, m, tp, dp = plan.pp, plan.virtual, plan.num_microbatches, plan.tp, plan.dp
        model.check_tp(tp)
        self.model, self.plan, self.p, self.v, self.m, self.tp, self.dp = model, plan, p, v, m, tp, dp
        self.z3 = plan.zero_stage == 3 and (dp > 1 or plan.offload_param != "none")
        self.sizes = layer_split(model.layers, p * v)  # layers of virtual stage c·p + s
        self.gsize = _group_sizes(granularity, self.sizes, 2 * p * v * m, 2 + (tp > 1) + 3 * self.z3)
        self.g = TaskGraph(p, v, max(self.gsize), max(n // k for n, k in zip(self.sizes, self.gsize)),
                           chunk_layers=self.sizes, group_sizes=self.gsize)
        r = recipe(plan.precision)
        self.K, self.pb, self.gb = r.K, r.bytes_per_param("params"), r.bytes_per_param("grads")
        width = 2 if r.name == "fp32" else 1  # activations and messages in 32 bits instead of 16
        b, sp, rc = plan.micro_batch_size, plan.sequence_parallel, plan.recompute
        att = plan.attention
        fwd = layer_forward_flops(model, b) / tp
        bwd = layer_backward_flops(model, b, rc, att) / tp
        hf = head_forward_flops(model, b) / tp if head else 0.0
        # element-wise kernels' bytes, forward and backward (plus what the backward recomputes)
        act = lambda rec: width * model.activation_terms(b, tp=tp, sp=sp, recompute=rec, attention=att).total
        ew = layer_elementwise_bytes(model, b, tp=tp, sp=sp, width=width, attention=att)
        ew_f, ew_b = ew["forward"], ew["backward"] + {"none": 0.0, "selective": ew["attention_core"],
                                                      "full": ew["forward"]}[rc]
        # compute of a group of k layers, forward and backward: [plain, with the output head]
        self.work_f = lambda k: [("compute", k * fwd, k * ew_f, 1), ("compute", k * fwd + hf, k * ew_f, 1)]
        self.work_b = lambda k: [("compute", k * bwd, k * ew_b, 1), ("compute", k * bwd + 2 * hf, k * ew_b, 1)]
        msg = 2 * width * b * model.seq * model.hidden
        op, per_layer = ("all_gather", 4) if sp else ("all_reduce", 2)  # SP: 2 AG + 2 RS, same cost as 2 AR
        self.tp_f = lambda k: (op, msg, "tp", per_layer * k) if tp > 1 else None
        self.tp_b = lambda k: (op, msg, "tp", per_layer * k * (2 if rc == "full" else 1)) if tp > 1 else None
        # Megatron's scatter/gather (Narayanan et al. §4.1): each TP rank sends 1/t of the activation
        self.p2p = ("p2p", msg / tp, "pp", 1)
        self.P1 = model.num_params / (tp * model.layers)  # parameters of one layer on one TP rank
        self.act1 = act(rc)
        self.act_transient = 0.0 if rc == "none" else act("none") - (act(rc) if rc == "selective" else 0)
        self.order = schedule_order(plan.schedule, p, m, v)
        self.computes: list[list[int]] = [[] for _ in range(p)]
        self.last_b = {}  # (stage, chunk) -> the micro-batch whose backward comes last
        for s, kind, i, c in self.order:
            if kind == "B":
                self.last_b[(s, c)] = i

    def build(self) -> TaskGraph:
        out: dict[tuple, int] = {}
        for s, kind, i, c in self.order:
            dep = dependency(kind, s, i, c, self.p, self.v)
            out[(kind, s, i, c)] = self.op(s, kind, i, c, out[dep] if dep else None)
        self.step()
        return self.g.finish()

    def gather(self, s, i, c, grp, deps) -> int:
        """ZeRO-3: fetch (offloaded) shards and all-gather one layer group's parameters."""
        P = self.P1 * self.gsize[c * self.p + s]
        g, pl, shard = self.g, self.plan, P / self.dp * self.pb
        first = None
        if pl.offload_param == "nvme":
            first = deps = [g.add("nvme_read", "nvme", s, ("nvme_read", shard, "", 1), deps, i, c, grp)]
        if pl.offload_param != "none":
            deps = [g.add("h2d", "h2d", s, ("h2d", shard, "", 1), deps, i, c, grp)]
            first = first or deps
        if self.dp > 1:
            deps = [g.add("zero3_gather", "dp_comm", s, ("all_gather", P * self.pb, "dp", 1), deps, i, c, grp)]
        g.mem((first or deps)[0], "zero3_gathered", P * self.pb)
        return deps[0]

    def op(self, s, kind, i, c, dep_node) -> int:
        """One forward or backward of micro-batch i, chunk c on stage s; returns its output node."""
        g, pl, fwd = self.g, self.plan, kind == "F"
        vs = c * self.p + s
        k = self.gsize[vs]  # layers per group here
        G, P, act = self.sizes[vs] // k, self.P1 * k, self.act1 * k
        work, tp_work = (self.work_f(k), self.tp_f(k)) if fwd else (self.work_b(k), self.tp_b(k))
        last_vs = vs == self.p * self.v - 1
        groups = list(range(G)) if fwd else list(reversed(range(G)))
        reduce_now = pl.zero_stage >= 2 or (not fwd and self.last_b[(s, c)] == i)
        comps = self.computes[s]  # this stage's compute nodes so far, in stream order
        n0 = len(comps)
        # ZeRO-3 prefetch, one group ahead: the gather for a stage's k-th compute starts once its
        # (k − 2)-th has ended, i.e. while the (k − 1)-th runs — across op boundaries too.
        ahead = lambda j: (comps[n0 + j - 2],) if n0 + j >= 2 else ()
        gathered = [None] * G
        lazy = self.z3 and not fwd and BACKWARD_GATHER == "on_demand"
        if self.z3:
            gathered[0] = self.gather(s, i, c, groups[0], ahead(0))
        # Without overlap_comm, DeepSpeed's ZeRO-2/3 reduce each micro-step's gradients on the compute
        # stream (stage_1_and_2.py, DeepSpeedZeroOptimizer.average_tensor: the current stream unless
        # overlap_comm), so the next micro-step's first compute waits for the last reduction.
        serial = g.last.get((s, "dp_comm")) if pl.zero_stage >= 2 and not pl.overlap_comm else None
        prev, buckets, bucket, pending = dep_node, [], 0.0, []
        for j, grp in enumerate(groups):
            if lazy and j > 0:
                gathered[j] = self.gather(s, i, c, grp, (comps[-1],))
            if self.z3 and not lazy and j + 1 < G:
                gathered[j + 1] = self.gather(s, i, c, groups[j + 1], ahead(j + 1))
            head = int(last_vs and grp == G - 1)
            # TP collectives block the compute stream (Megatron calls them synchronously inside the
            # layer), so an op's first group also waits for the previous op's last TP collective.
            blocking = g.last.get((s, "tp_comm")) if j == 0 and self.tp > 1 else None
            comp = g.add("forward" if fwd else "backward", "compute", s, work[head],
                         (prev, gathered[j], blocking, serial if j == 0 else None), i, c, grp)
            comps.append(comp)
            if fwd:
                g.mem(comp, "activation", act)
            else:
                g.mem(comp, "activation", -act, at_end=True)
                g.mem(comp, "activation", self.act_transient)
                g.mem(comp, "activation", -self.act_transient, at_end=True)
            if self.z3:
                g.mem(comp, "zero3_gathered", -P * self.pb, at_end=True)
            prev = comp
            if self.tp > 1:
                prev = g.add("tp_comm", "tp_comm", s, tp_work, (comp,), i, c, grp)
            if not fwd and reduce_now:
                if pl.zero_stage >= 2 and self.dp > 1:  # the unreduced gradient waits in a bucket
                    g.mem(comp, "comm_bucket", P * self.gb)
                    pending.append(comp)
                bucket += P
                if bucket >= pl.reduce_bucket_size or j == G - 1:
                    buckets.append((bucket, prev, pending))
                    bucket, pending = 0.0, []
                    if pl.overlap_comm:
                        self.reduce(s, i, c, grp, *buckets.pop())
        for bucket, _, pending in buckets:  # without overlap: after the whole backward
            self.reduce(s, i, c, groups[-1], bucket, prev, pending)
        needs_send = self.p > 1 and ((fwd and not last_vs) or (not fwd and c * self.p + s > 0))
        if not needs_send:
            return prev
        return g.add("send_fwd" if fwd else "send_bwd", "pp_comm", s, self.p2p, (prev,), i, c)

    def reduce(self, s, i, c, grp, params, after, pending) -> None:
        """Reduce one bucket of gradients over DP (and copy its shard to the host when offloading)."""
        g, pl, node = self.g, self.plan, after
        if self.dp > 1:
            op = "all_reduce" if pl.zero_stage == 0 else "reduce_scatter"
            node = g.add("grad_reduce", "dp_comm", s, (op, params * self.gb, "dp", 1), (after,), i, c, grp)
            g.mem(node, "comm_bucket", -len(pending) * self.P1 * self.gsize[c * self.p + s] * self.gb, at_end=True)
        if pl.offload_optimizer != "none":
            g.add("d2h", "d2h", s, ("d2h", params / self.dp * self.gb, "", 1), (node,), i, c, grp)

    def step(self) -> None:
        """Gradient-norm sync, then the optimizer step on each stage, chunk by chunk."""
        g, pl, dp = self.g, self.plan, self.dp
        ready = [[g.last.get((s, st)) for st in ("compute", "tp_comm", "dp_comm", "d2h")] for s in range(self.p)]
        if pl.gradient_clipping > 0 and pl.world_size > 1:
            everyone = tuple(n for r in ready for n in r)
            ready = [[g.add("grad_norm", "dp_comm", s, ("all_reduce", 4, "world", 1), everyone)]
                     for s in range(self.p)]
        g_layers = self.gsize[0] if len(set(self.gsize)) == 1 else 1
        unit = self.P1 * g_layers  # the optimizer steps in chunks of whole groups
        per_chunk = max(1, int(pl.allgather_bucket_size // unit))
        for s in range(self.p):
            total = sum(self.sizes[c * self.p + s] for c in range(self.v)) // g_layers
            for k, first in enumerate(range(0, total, per_chunk)):
                full = unit * min(per_chunk, total - first)            # parameters of the chunk on this rank
                shard = full / dp if pl.zero_stage >= 1 else full      # the part this rank updates
                u = self.update(s, k, shard, ready[s])
                if pl.zero_stage in (1, 2) and dp > 1:
                    g.add("param_gather", "dp_comm", s, ("all_gather", full * self.pb, "dp", 1), (u,), group=k)

    def update(self, s, k, shard, deps) -> int:
        """Adam on ``shard`` parameters: on the GPU, or on the host with its transfers."""
        g, pl, K, pb = self.g, self.plan, self.K, self.pb
        if pl.offload_optimizer == "none":
            u = g.add("optimizer", "compute", s, ("adam", shard, "", 1), deps, group=k)
            if pl.offload_param != "none":
                u = g.add("d2h", "d2h", s, ("d2h", shard * pb, "", 1), (u,), group=k)
        else:
            if pl.offload_optimizer == "nvme":
                deps = (g.add("nvme_read", "nvme", s, ("nvme_read", shard * K, "", 1), deps, group=k),)
            u = g.add("cpu_adam", "cpu", s, ("cpu_adam", shard, "", 1), deps, group=k)
            if pl.offload_optimizer == "nvme":
                g.add("nvme_write", "nvme", s, ("nvme_write", shard * K, "", 1), (u,), group=k)
            if pl.offload_param == "none":
                u = g.add("h2d", "h2d", s, ("h2d", shard * pb, "", 1), (u,), group=k)
        if pl.offload_param == "nvme":
            u = g.add("nvme_write", "nvme", s, ("nvme_write", shard * pb, "", 1), (u,), group=k)
        return u


def build_graph(model, plan, *, granularity="auto", head: bool = True) -> TaskGraph:
    """Lower (model, plan) to the TaskGraph of one step (see the module docstring).

    ``granularity``: 'layer' (a node per layer), 'stage' (all layers of a model chunk in one node),
    a number of layers per node, or 'auto' (per layer unless the graph would exceed MAX_NODES).
    ``head``: count the output projection's FLOPs on the last stage.
    """
    return _Lowering(model, plan, granularity, head).build()


def node_name(graph: TaskGraph, i: int) -> str:
    """A readable name: 'F3 layers 0-5', 'B3.c1 layers 48-53', 'grad_reduce B7 layers 12-17', 'optimizer 0'."""
    kind, mb, chunk, grp = KINDS[graph.kind[i]], graph.mb[i], graph.chunk[i], graph.group[i]
    if mb < 0:
        return f"{kind} {grp}" if grp >= 0 else kind
    phase = "F" if kind in ("forward", "send_fwd") else "B" if kind in ("backward", "send_bwd") else ""
    op = f"{phase or 'mb'}{mb}" + (f".c{chunk}" if graph.virtual > 1 else "")
    if grp < 0:
        return f"{kind} {op}"
    vs = chunk * graph.stages + graph.stage[i]
    gl = graph.group_sizes[vs]
    first = graph.first_layer[vs] + grp * gl
    layers = f"layer {first}" if gl == 1 else f"layers {first}-{first + gl - 1}"
    return f"{op} {layers}" if phase else f"{kind} {op} {layers}"
