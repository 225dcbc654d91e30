"""Lowering (model, plan) to the TaskGraph of one step (sim.step.graph), in a pipeline schedule's order.

Per micro-batch op (F or B of one model chunk on one stage) and layer group:

    [ZeRO-3: (NVMe read →) (H2D →) all-gather of the group: F one group ahead,
             B when the group's backward starts]                           dp_comm
    compute of the group                                                   compute
    TP collectives of the group (blocking: the next compute waits)         tp_comm
    B: gradient reduce per bucket (the plan's framework's collectives, sim.step.frameworks;
       0–1 after the last micro-batch's backward, 2–3 after every one) (→ D2H when offloading)  dp_comm
ZB-H1 (schedule 'zb-h1') splits each backward into B (input gradients: compute, TP collectives,
send) and a later W (weight gradients, compute only); the gradient buckets fill and reduce after W.
Then a send of the op's output to the neighbouring stage (pp_comm; each TP rank sends 1/t of it,
Megatron's scatter/gather). A compute node's work holds its FLOPs and the bytes of its element-wise
kernels (sim.cost.flops.layer_elementwise_bytes). After the last op: an optional
global gradient-norm all-reduce, and the optimizer step in chunks: Adam on the GPU, or (NVMe read
→) CPU Adam (→ NVMe write) → H2D of the updated 16-bit parameters; stages 1–2 all-gather them.
FSDP2 plans (zero_stage 3) gather and reduce per unit, one unit per layer group, prefetching the
next unit in the backward too, over the shard group under HSDP (sim.step.frameworks).
DeepSpeed ZeRO-3 with ZeRO++ (sim.step.zeropp): qwZ's int8 gathers, hpZ's later gathers over the node's
sub-group, qgZ's two int4 all-to-alls per bucket; their (de)quantize kernels add to the layer's HBM bytes.

ZeRO-3's gathers follow DeepSpeed's hooks: a module's parameters are fetched before its forward,
the next module's prefetched while it runs; in the backward (with activation checkpointing the
recomputed forward runs inside it) the fetch is issued when the module's backward starts and waits
behind the previous module's gradient reduce-scatter on the same stream, so gathers do not overlap
the backward's compute — what DeepSpeed #1170 ("the prefetching only partially overlaps with
computation", 2021) and PyTorch #70235 (FSDP's backward all-gathers "not triggered until current
layer's backward pass starts", queued behind reduce-scatters on one NCCL stream) describe, and
what Narayanan et al.'s ZeRO-3 times show (sim.calibration). ``BACKWARD_GATHER`` switches it.

Parameters are spread evenly over the layers (Ψ/L each, embeddings included), as zero_ref.memory
splits Ψ evenly over tp·pp; the output head's FLOPs (2bshV) run on the last stage when ``head``.

Context parallelism (Plan.cp > 1) gives each rank s/cp tokens of every sequence: its FLOPs,
element-wise bytes, activations and TP/PP messages fall as 1/cp, and its gradients are reduced
(and ZeRO shards) over the dp·cp ranks that hold the same parameters. A group's compute splits
around its attention core, which talks over the cp group on the cp_comm stream:

    ring     forward: cp attention blocks, one per K/V block; the send of the next block runs
             beside the current block (cp − 1 sends). Backward: cp blocks of backward attention,
             beside each of the first cp − 1 a send of a K/V block and a dK/dV block; the last
             dK/dV is sent home after the last block, and the rest of the backward waits for it.
    ulysses  all-to-alls of Q, K and V before the attention core and of its output after it
             (in backward of the output's gradient before, of dQ, dK, dV after), blocking compute.

A group of L layers carries each layer's traffic L times over (``count``) beside L layers of
attention per block: the same time as L rings one after another, since each step takes
max(attention, send) and both scale with L. Full recompute repeats the forward's traffic in the
backward; selective recompute and FlashAttention recompute the scores block by block from the
K/V at hand, with no traffic of their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from zero_ref.memory import recipe
from zero_ref.parallel.context import ring_bytes
from sim.cost import context
from sim.cost.flops import (CAUSAL, attention_core_flops, head_forward_flops, layer_elementwise_bytes, layer_flops,
                             layer_forward_flops)
from sim.cost.work import Adam, Collective, Compute, Copy
from sim.step import frameworks, zeropp
from sim.step.graph import TaskGraph
from sim.step.pipeline import dependency, schedule_order

# 'auto' granularity folds layers until the graph is at most this big
MAX_NODES = 300_000
# ZeRO-3's backward gathers: "on_demand" (issued when a group's backward starts, behind the previous
# reduce-scatter on the one DP stream: DeepSpeed as Narayanan et al. ran it, see the module
# docstring) or "prefetch" (one group ahead, like the forward's).
BACKWARD_GATHER = "on_demand"


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


@dataclass
class _Buckets:
    """A backward's gradients on their way to the DP reduce: the open bucket and the closed ones."""

    params: float = 0.0                                  # parameters in the open bucket
    waiting: list = field(default_factory=list)          # compute nodes whose gradients wait in it (ZeRO-2/3)
    closed: list = field(default_factory=list)           # (params, last node, waiting) not yet reduced


class _Lowering:
    """Builds the TaskGraph of (model, plan); one method per piece of the step."""

    def __init__(self, model, plan, granularity, head: bool):
        stages, virtual, tp = plan.pp, plan.virtual, plan.tp
        model.check_tp(tp)
        cp = plan.cp
        if cp > 1:
            context.check(model, plan)
        # the gradient reduce and ZeRO's shards span the dp·cp ranks holding the same parameters
        self.model, self.plan, self.tp, self.cp, self.dp = model, plan, tp, cp, plan.dp * cp
        self.stages, self.virtual, self.microbatches = stages, virtual, plan.num_microbatches
        self.gathers_params = plan.zero_stage == 3 and (self.dp > 1 or plan.offload_param != "none")
        self.shard = plan.shard_group  # ranks the model states are sharded over (dp·cp, or HSDP's dp_shard·cp)
        self.param_synced: set = set()  # (stage, chunk) whose parameters Megatron's overlapped gather delivered
        self.gathered_once: set = set()  # ZeRO++ hpZ: (stage, chunk, group) gathered this step (secondary shard held)
        self.zeropp_kernels: dict = {}  # ZeRO++: gather node -> HBM bytes of its (de)quantize kernels
        self.chunk_layers = layer_split(model.layers, stages * virtual)  # layers of virtual stage c·p + s
        nodes_per_group = 2 + (tp > 1) + 3 * self.gathers_params + (4 * cp + 6 if cp > 1 else 0)
        self.split_w = plan.schedule == "zb-h1"  # weight gradients in their own op W
        self.grad_kind = "W" if self.split_w else "B"  # the op whose gradients go to the DP reduce
        self.group_layers = _group_sizes(granularity, self.chunk_layers,
                                         (2 + self.split_w) * stages * virtual * self.microbatches,
                                         nodes_per_group)
        self.graph = TaskGraph(stages, virtual, max(self.group_layers),
                               max(n // k for n, k in zip(self.chunk_layers, self.group_layers)),
                               chunk_layers=self.chunk_layers, group_sizes=self.group_layers)
        r = recipe(plan.precision)
        self.optim_bytes = r.K  # optimizer-state bytes per parameter
        self.param_bytes, self.grad_bytes = r.bytes_per_param("params"), r.bytes_per_param("grads")
        self.width = 2 if r.name == "fp32" else 1  # activations and messages in 32 bits instead of 16
        b, sp, rc, att = plan.micro_batch_size, plan.sequence_parallel, plan.recompute, plan.attention
        # (GEMM, FlashAttention) FLOPs per layer on one rank, forward and backward
        (self.layer_fwd_flops, self.layer_fwd_attn), (self.layer_bwd_flops, self.layer_bwd_attn) = (
            (g / (tp * cp), a / (tp * cp)) for g, a in layer_flops(model, b, rc, att, plan.recompute_gemms).values())
        self.head_flops = head_forward_flops(model, b) / (tp * cp) if head else 0.0
        if cp > 1:
            self.context_parallel_terms(model, b)
        self.layer_w_flops = self.weight_grad_flops(b) if self.split_w else 0.0
        self.layer_bwd_flops -= self.layer_w_flops
        # element-wise kernels' bytes, forward and backward (plus what the backward recomputes)
        ew = layer_elementwise_bytes(model, b, tp=tp, sp=sp, width=self.width, attention=att)
        ew = {k: v / cp for k, v in ew.items()}  # s/cp tokens' queries (against all s keys)
        self.layer_fwd_bytes = ew["forward"]
        self.layer_bwd_bytes = ew["backward"] + {"none": 0.0, "selective": ew["attention_core"],
                                                 "full": ew["forward"]}[rc]
        self.message = 2 * self.width * b * model.seq * model.hidden / cp
        # SP: 2 all-gathers + 2 reduce-scatters per layer, the same cost as 2 all-reduces
        self.tp_op, self.tp_per_layer = ("all_gather", 4) if sp else ("all_reduce", 2)
        # Megatron's scatter/gather (Narayanan et al. §4.1): each TP rank sends 1/t of the activation
        self.send = Collective("p2p", self.message / tp, "pp")
        self.layer_params = model.num_params / (tp * model.layers)  # parameters of one layer on one TP rank
        self.layer_activation = self.activation(rc)
        self.act_transient = 0.0 if rc == "none" else self.activation("none") - (
            self.activation(rc) if rc == "selective" else 0)
        self.order = schedule_order(plan.schedule, stages, self.microbatches, virtual)
        self.computes: list[list[int]] = [[] for _ in range(stages)]
        self.last_b = {}  # (stage, chunk) -> the micro-batch whose gradient op (B, or W) comes last
        for s, kind, i, c in self.order:
            if kind == self.grad_kind:
                self.last_b[(s, c)] = i

    def weight_grad_flops(self, batch: int) -> float:
        """One layer's W pass on one TP rank: each weight GEMM's weight gradient costs its forward's
        FLOPs, so W = the forward less the attention core (QKᵀ and scores × V have no weights: their
        backward, 2 × 4bs²h, is all input gradient, in B with any recomputation)."""
        return (layer_forward_flops(self.model, batch) - attention_core_flops(self.model, batch)) / (self.tp * self.cp)

    def activation(self, recompute: str) -> float:
        """Bytes one layer keeps for its backward under ``recompute``."""
        pl = self.plan
        return self.width * self.model.activation_terms(pl.micro_batch_size, tp=self.tp, sp=pl.sequence_parallel,
                                                        recompute=recompute, attention=pl.attention).total / self.cp

    def compute_work(self, forward: bool, layers: int, head: bool) -> Compute:
        """A group of ``layers`` layers, forward or backward, with the output head's FLOPs when ``head``
        (ZB-H1's B takes one head GEMM, its W the other)."""
        if forward:
            return Compute(layers * self.layer_fwd_flops + self.head_flops if head else layers * self.layer_fwd_flops,
                           layers * self.layer_fwd_bytes, layers * self.layer_fwd_attn)
        head_b = (1 if self.split_w else 2) * self.head_flops
        return Compute(layers * self.layer_bwd_flops + head_b if head else layers * self.layer_bwd_flops,
                       layers * self.layer_bwd_bytes, layers * self.layer_bwd_attn)

    def tp_work(self, forward: bool, layers: int) -> Collective:
        """The TP collectives of a group of ``layers`` layers (the backward's doubled by full recompute)."""
        count = self.tp_per_layer * layers
        if not forward:
            count = count * (2 if self.plan.recompute == "full" else 1)
        return Collective(self.tp_op, self.message, "tp", count)

    def build(self) -> TaskGraph:
        out: dict[tuple, int] = {}
        for s, kind, i, c in self.order:
            dep = dependency(kind, s, i, c, self.stages, self.virtual)
            out[(kind, s, i, c)] = self.op(s, kind, i, c, out[dep] if dep else None)
        self.step()
        return self.graph.finish()

    def gather(self, s, i, c, grp, deps) -> int:
        """ZeRO-3: fetch (offloaded) shards and all-gather one layer group's parameters."""
        params = self.layer_params * self.group_layers[c * self.stages + s]
        g, pl, shard = self.graph, self.plan, params / self.shard * self.param_bytes
        first = None
        if pl.offload_param == "nvme":
            first = deps = [g.add("nvme_read", "nvme", s, Copy("nvme_read", shard), deps, i, c, grp)]
        if pl.offload_param != "none":
            deps = [g.add("h2d", "h2d", s, Copy("h2d", shard), deps, i, c, grp)]
            first = first or deps
        if self.dp > 1 and pl.zeropp:  # ZeRO++: qwZ's int8 gathers, hpZ's sub-group after the first
            work, kernels = zeropp.gather(pl, params, self.param_bytes, (s, c, grp) not in self.gathered_once)
            self.gathered_once.add((s, c, grp))
            deps = [g.add("zero3_gather", "dp_comm", s, work, deps, i, c, grp)]
            self.zeropp_kernels[deps[0]] = kernels
        elif self.dp > 1:
            work = Collective("all_gather", params * self.param_bytes, frameworks.gather_axis(pl))
            deps = [g.add("zero3_gather", "dp_comm", s, work, deps, i, c, grp)]
        g.mem((first or deps)[0], "zero3_gathered", params * self.param_bytes)
        return deps[0]

    def prefetch_after(self, s, n) -> tuple:
        """ZeRO-3 prefetch, one group ahead: the gather for a stage's n-th compute starts once its
        (n − 2)-th has ended, i.e. while the (n − 1)-th runs — across op boundaries too."""
        return (self.computes[s][n - 2],) if n >= 2 else ()

    def gather_next(self, s, i, c, groups, j, gathered, on_demand: bool, n0: int) -> None:
        """ZeRO-3, before group j's compute: its own gather when on demand, else the next group's."""
        if on_demand and j > 0:
            gathered[j] = self.gather(s, i, c, groups[j], (self.computes[s][-1],))
        if not on_demand and j + 1 < len(groups):
            gathered[j + 1] = self.gather(s, i, c, groups[j + 1], self.prefetch_after(s, n0 + j + 1))

    def op(self, s, kind, i, c, dep_node) -> int:
        """One forward or backward of micro-batch i, chunk c on stage s; returns its output node."""
        if kind == "W":
            return self.weight_op(s, i, c, dep_node)
        g, pl, fwd = self.graph, self.plan, kind == "F"
        vs = c * self.stages + s
        layers = self.group_layers[vs]
        n_groups = self.chunk_layers[vs] // layers
        group_params = self.layer_params * layers
        last_vs = vs == self.stages * self.virtual - 1
        groups = list(range(n_groups)) if fwd else list(reversed(range(n_groups)))
        reduce_now = kind == self.grad_kind and (pl.zero_stage >= 2 or self.last_b[(s, c)] == i)
        n0 = len(self.computes[s])  # this stage's compute nodes so far, in stream order
        gathered = [None] * n_groups
        # FSDP2 prefetches the next unit in the backward too; without reshard it gathers nothing there
        gathers = self.gathers_params and (fwd or not frameworks.keeps_gathered(pl))
        on_demand = gathers and not fwd and BACKWARD_GATHER == "on_demand" and (pl.framework != "fsdp2"
                                                                                 or not pl.backward_prefetch)
        if gathers:
            gathered[0] = self.gather(s, i, c, groups[0], self.prefetch_after(s, n0))
        # Without overlap_comm, DeepSpeed's ZeRO-2/3 reduce each micro-step's gradients on the compute
        # stream (stage_1_and_2.py, DeepSpeedZeroOptimizer.average_tensor: the current stream unless
        # overlap_comm), so the next micro-step's first compute waits for the last reduction.
        serial = g.last.get((s, "dp_comm")) if pl.zero_stage >= 2 and not pl.overlap_comm else None
        prev, buckets = dep_node, _Buckets()
        for j, grp in enumerate(groups):
            if gathers:
                self.gather_next(s, i, c, groups, j, gathered, on_demand, n0)
            # TP collectives block the compute stream (Megatron calls them synchronously inside the
            # layer), so an op's first group also waits for the previous op's last TP collective.
            blocking = g.last.get((s, "tp_comm")) if j == 0 and self.tp > 1 else None
            if fwd and (s, c) not in self.param_synced and frameworks.gathers_in_next_forward(pl):
                work = Collective("all_gather", group_params * self.param_bytes, "dp")
                gathered[j] = g.add("param_gather", "dp_comm", s, work, (), i, c, grp)  # the stream chains them
            work = self.compute_work(fwd, layers, head=last_vs and grp == n_groups - 1)
            if pl.zeropp:  # ZeRO++'s (de)quantize kernels run on the compute stream, before the layer's use
                extra = self.zeropp_kernels.pop(gathered[j], 0.0)
                if reduce_now and pl.zero_quantized_gradients and self.dp > 1:
                    extra += zeropp.reduce_kernel_bytes(pl, group_params, self.grad_bytes)
                work = replace(work, hbm_bytes=work.hbm_bytes + extra)
            comp = self.compute(s, fwd, work, (prev, gathered[j], blocking, serial if j == 0 else None),
                                i, c, grp, layers)
            prev = comp
            if self.tp > 1:
                prev = g.add("tp_comm", "tp_comm", s, self.tp_work(fwd, layers), (comp,), i, c, grp)
            if reduce_now:
                self.fill_bucket(buckets, s, i, c, grp, comp, prev, group_params, last=j == n_groups - 1)
        for params, _, waiting in buckets.closed:  # without overlap: after the whole backward
            self.reduce(s, i, c, groups[-1], params, prev, waiting)
        if fwd:
            self.param_synced.add((s, c))
        needs_send = self.stages > 1 and ((fwd and not last_vs) or (not fwd and vs > 0))
        if not needs_send:
            return prev
        return g.add("send_fwd" if fwd else "send_bwd", "pp_comm", s, self.send, (prev,), i, c)

    def weight_op(self, s, i, c, dep_node) -> int:
        """ZB-H1's W of micro-batch i, chunk c on stage s: each group's weight gradients, last layer
        first, filling the DP buckets; the activations the B left for it are freed as it ends."""
        g, pl = self.graph, self.plan
        vs = c * self.stages + s
        layers = self.group_layers[vs]
        n_groups = self.chunk_layers[vs] // layers
        last_vs = vs == self.stages * self.virtual - 1
        reduce_now = pl.zero_stage >= 2 or self.last_b[(s, c)] == i
        prev, buckets = dep_node, _Buckets()
        for j, grp in enumerate(reversed(range(n_groups))):
            flops = layers * self.layer_w_flops + (self.head_flops if last_vs and grp == n_groups - 1 else 0.0)
            comp = g.add("weight_grad", "compute", s, Compute(flops, 0.0), (prev,), i, c, grp)
            self.computes[s].append(comp)
            g.mem(comp, "activation", -self.layer_activation * layers, at_end=True)
            prev = comp
            if reduce_now:
                self.fill_bucket(buckets, s, i, c, grp, comp, comp, self.layer_params * layers, last=j == n_groups - 1)
        for params, _, waiting in buckets.closed:
            self.reduce(s, i, c, 0, params, prev, waiting)
        return prev

    def compute(self, s, fwd, work, deps, i, c, grp, layers) -> int:
        """A group's forward or backward on the compute stream, with its activation and gathered-parameter memory."""
        g = self.graph
        if self.cp > 1:
            first, comp = self.context_parallel(s, fwd, work, deps, i, c, grp, layers)
        else:
            first = comp = g.add("forward" if fwd else "backward", "compute", s, work, deps, i, c, grp)
        self.computes[s].append(comp)
        act = self.layer_activation * layers
        if fwd:
            g.mem(first, "activation", act)
        else:
            if not self.split_w:  # (ZB-H1: freed by the W, which still needs them)
                g.mem(comp, "activation", -act, at_end=True)
            g.mem(first, "activation", self.act_transient)
            g.mem(comp, "activation", -self.act_transient, at_end=True)
        if self.gathers_params and not (fwd and frameworks.keeps_gathered(self.plan)):  # else freed by its backward
            g.mem(comp, "zero3_gathered", -(self.layer_params * layers) * self.param_bytes, at_end=True)
        return comp

    def context_parallel_terms(self, model, b) -> None:
        """Per layer on one rank: attention-core and QKV-projection FLOPs, and the cp traffic's units."""
        pl, tp, cp, s = self.plan, self.tp, self.cp, model.seq
        d, e = model.hidden // model.heads, 2 * self.width
        heads, kv = model.heads // tp, model.key_value_heads // tp
        self.core_flops = attention_core_flops(model, b) / (tp * cp)
        self.qkv_flops = 2 * b * s * model.hidden * (model.hidden + 2 * model.kv_width) / (tp * cp)
        rc, att, core = pl.recompute, pl.attention, self.core_flops
        # the backward's attention core: its gradient (twice the forward) and the scores it recomputes
        self.core_bwd_flops = 2 * core + (core if rc == "selective" else core / 2 if att == "flash" and rc == "none"
                                          else 0.0)
        if pl.cp_kind == "ring":
            self.cp_block = ring_bytes(b, s, kv, d, cp, e)["forward"] / (cp - 1)  # one K/V block
        else:
            self.cp_q = b * (s // cp) * heads * d * e   # Q (and the output) handed to one all-to-all
            self.cp_kv = b * (s // cp) * kv * d * e     # K (and V)

    def context_parallel(self, s, fwd, work, deps, i, c, grp, layers) -> tuple[int, int]:
        """A group's compute under cp (see the module docstring); returns its first and last node."""
        g, pl, n = self.graph, self.plan, layers
        full = not fwd and pl.recompute == "full"
        core_f, core_b, qkv = n * self.core_flops, n * self.core_bwd_flops, n * self.qkv_flops
        core = core_f if fwd else core_b + (core_f if full else 0.0)
        # projections, MLP, head: no cp traffic ('flash': the core is not among the GEMMs, see core_work)
        rest = work.flops - (0.0 if pl.attention == "flash" else core)
        kind = "forward" if fwd else "backward"
        if fwd:
            parts = [Compute(qkv, work.hbm_bytes), ("forward", core_f), Compute(rest - qkv)]
        elif full:  # the recomputed forward's attention (with its traffic), then the backward's
            parts = [Compute(qkv), ("forward", core_f), Compute(rest - 3 * qkv, work.hbm_bytes),
                     ("backward", core_b), Compute(2 * qkv)]
        else:
            parts = [Compute(rest - 2 * qkv, work.hbm_bytes), ("backward", core_b), Compute(2 * qkv)]
        first = prev = None
        for part in parts:
            if isinstance(part, Compute):
                prev = g.add(kind, "compute", s, part, deps if prev is None else (prev,), i, c, grp)
            elif pl.cp_kind == "ring":
                prev = self.ring(s, part[0] == "forward", part[1], prev, n, i, c, grp)
            else:
                prev = self.ulysses(s, part[0] == "forward", part[1], prev, n, i, c, grp)
            first = first if first is not None else prev
        return first, prev

    def core_work(self, flops: float) -> Compute:
        """The attention core's ``flops`` (as counted: the full s²): GEMMs ('eager'), or FlashAttention's
        causal kernels at their own rate ('flash', sim.cost.flops.layer_flops)."""
        return Compute(0.0, 0.0, CAUSAL * flops) if self.plan.attention == "flash" else Compute(flops)

    def ring(self, s, fwd, flops, before, n, i, c, grp) -> int:
        """Ring attention over cp blocks, each step's send beside the current block; returns the last node."""
        g, cp = self.graph, self.cp
        block = self.core_work(flops / cp)
        # forward: one K/V block per step; backward: a K/V block and a dK/dV block
        send = Collective("p2p", self.cp_block, "cp", n if fwd else 2 * n)
        comp = g.add("attention", "compute", s, block, (before,), i, c, grp)
        sent = g.add("cp_send", "cp_comm", s, send, (before,), i, c, grp)
        for k in range(1, cp):
            ready = (comp, sent)
            comp = g.add("attention", "compute", s, block, ready, i, c, grp)
            if k < cp - 1:
                sent = g.add("cp_send", "cp_comm", s, send, ready, i, c, grp)
        if fwd:
            return comp
        home = Collective("p2p", self.cp_block, "cp", n)  # the last dK/dV, home: nothing left to hide it
        return g.add("cp_send", "cp_comm", s, home, (comp, sent), i, c, grp)

    def ulysses(self, s, fwd, flops, before, n, i, c, grp) -> int:
        """All-to-alls before and after the attention core (Q, K, V in and the output back; in backward
        the output's gradient in and dQ, dK, dV back), blocking; returns the last node."""
        g = self.graph
        q, kv = Collective("all_to_all", self.cp_q, "cp", n), Collective("all_to_all", self.cp_kv, "cp", 2 * n)
        inbound, outbound = ((q, kv), (q,)) if fwd else ((q,), (q, kv))
        prev = before
        for work in inbound:
            prev = g.add("cp_all_to_all", "cp_comm", s, work, (prev,), i, c, grp)
        prev = g.add("attention", "compute", s, self.core_work(flops), (prev,), i, c, grp)
        for work in outbound:
            prev = g.add("cp_all_to_all", "cp_comm", s, work, (prev,), i, c, grp)
        return prev

    def fill_bucket(self, buckets: _Buckets, s, i, c, grp, comp, after, group_params, *, last: bool) -> None:
        """Add a group's gradients to the open bucket; close it when full or at the op's last group
        (and reduce it at once with ``overlap_comm``)."""
        pl = self.plan
        if pl.zero_stage >= 2 and self.dp > 1:  # the unreduced gradient waits in a bucket
            self.graph.mem(comp, "comm_bucket", group_params * self.grad_bytes)
            buckets.waiting.append(comp)
        buckets.params += group_params
        per_unit = frameworks.reduces_per_unit(pl)
        if buckets.params >= pl.reduce_bucket_size or last or per_unit:
            buckets.closed.append((buckets.params, after, buckets.waiting))
            buckets.params, buckets.waiting = 0.0, []
            if pl.overlap_comm or per_unit:
                self.reduce(s, i, c, grp, *buckets.closed.pop())

    def reduce(self, s, i, c, grp, params, after, waiting) -> None:
        """Reduce one bucket of gradients over DP (and copy its shard to the host when offloading)."""
        g, pl, node = self.graph, self.plan, after
        if self.dp > 1:
            works = zeropp.grad_reduce(pl, params) if pl.zero_quantized_gradients else \
                frameworks.grad_reduce(pl, params, self.grad_bytes)
            for work in works:
                node = g.add("grad_reduce", "dp_comm", s, work, (node,), i, c, grp)
            freed = -len(waiting) * self.layer_params * self.group_layers[c * self.stages + s] * self.grad_bytes
            g.mem(node, "comm_bucket", freed, at_end=True)
        if pl.offload_optimizer != "none":
            g.add("d2h", "d2h", s, Copy("d2h", params / self.dp * self.grad_bytes), (node,), i, c, grp)

    def step(self) -> None:
        """Gradient-norm sync, then the optimizer step on each stage, chunk by chunk."""
        g, pl, dp = self.graph, self.plan, self.dp
        ready = [[g.last.get((s, st)) for st in ("compute", "tp_comm", "dp_comm", "d2h")] for s in range(self.stages)]
        if pl.gradient_clipping > 0 and pl.world_size > 1:
            everyone = tuple(n for r in ready for n in r)
            ready = [[g.add("grad_norm", "dp_comm", s, Collective("all_reduce", 4, "world"), everyone)]
                     for s in range(self.stages)]
        g_layers = self.group_layers[0] if len(set(self.group_layers)) == 1 else 1
        unit = self.layer_params * g_layers  # the optimizer steps in chunks of whole groups
        per_chunk = max(1, int(pl.allgather_bucket_size // unit))
        for s in range(self.stages):
            total = sum(self.chunk_layers[c * self.stages + s] for c in range(self.virtual)) // g_layers
            for k, first in enumerate(range(0, total, per_chunk)):
                full = unit * min(per_chunk, total - first)            # parameters of the chunk on this rank
                shard = full / self.shard if pl.zero_stage >= 1 else full  # the part this rank updates
                u = self.update(s, k, shard, ready[s])
                if frameworks.gathers_after_step(pl) and dp > 1 and not frameworks.gathers_in_next_forward(pl):
                    work = Collective("all_gather", full * self.param_bytes, "dp")
                    g.add("param_gather", "dp_comm", s, work, (u,), group=k)

    def update(self, s, k, shard, deps) -> int:
        """Adam on ``shard`` parameters: on the GPU, or on the host with its transfers."""
        g, pl, optim, param = self.graph, self.plan, self.optim_bytes, self.param_bytes
        if pl.offload_optimizer == "none":
            u = g.add("optimizer", "compute", s, Adam(shard, "gpu"), deps, group=k)
            if pl.offload_param != "none":
                u = g.add("d2h", "d2h", s, Copy("d2h", shard * param), (u,), group=k)
        else:
            if pl.offload_optimizer == "nvme":
                deps = (g.add("nvme_read", "nvme", s, Copy("nvme_read", shard * optim), deps, group=k),)
            u = g.add("cpu_adam", "cpu", s, Adam(shard, "cpu"), deps, group=k)
            if pl.offload_optimizer == "nvme":
                g.add("nvme_write", "nvme", s, Copy("nvme_write", shard * optim), (u,), group=k)
            if pl.offload_param == "none":
                u = g.add("h2d", "h2d", s, Copy("h2d", shard * param), (u,), group=k)
        if pl.offload_param == "nvme":
            u = g.add("nvme_write", "nvme", s, Copy("nvme_write", shard * param), (u,), group=k)
        return u


def build_graph(model, plan, *, granularity="auto", head: bool = True) -> TaskGraph:
    """Lower (model, plan) to the TaskGraph of one step (see the module docstring).

    ``granularity``: 'layer' (a node per layer), 'stage' (all layers of a model chunk in one node),
    a number of layers per node, or 'auto' (per layer unless the graph would exceed MAX_NODES).
    ``head``: count the output projection's FLOPs on the last stage.
    """
    return _Lowering(model, plan, granularity, head).build()
