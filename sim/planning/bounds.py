"""What a plan needs at least, without simulating it: GPU memory and step time lower bounds.

The plan search (sim.planning.search) uses these to discard plans before building their task graphs. A
discarded plan must be one the simulator would also reject (or rank lower), so both numbers are
*lower bounds* of what ``sim.simulate`` reports, never estimates that could be too high:

Memory. The static model states (zero_ref.memory, exactly as sim.step.memory_timeline places them)
plus what stage 0 provably holds when its first backward starts: the activations of every
micro-batch chunk in flight (the schedule's warm-up forwards and one more; the model's bytes
per layer, zero_ref.memory.activation_terms), the layer the backward recomputes (with recomputation), ZeRO-3's gathered layer and
ZeRO-2/3's first unreduced gradient bucket — each at least one layer's worth, whatever the graph's
granularity.

Time. The list-scheduling engine is monotone: making any task shorter never makes the step
longer. So the step is at least the critical chain with every other task free: stage s cannot
start its first forward before stages 0 … s−1 have each run one chunk forward (with its TP
collectives and the send), then runs all its forwards and backwards one after another (compute
and blocking TP collectives form one chain), and its last backward must then travel back
through stages s−1 … 0 (ZB-H1: only its input-gradient pass B travels, and up to min(s, m) + 1 of
stage s's weight-gradient passes W may run after its last B); then stage 0 runs its optimizer step
(ZeRO-1/2: and all-gathers the updated parameters). Streams that run one task at a time give further
bounds, the sum of their tasks: the DP stream (ZeRO-2/3 reduce every backward, ZeRO-3 gathers every
layer group twice per micro-batch: sim.step.frameworks says with which collectives), parameter copies
from the host or NVMe. Context parallelism divides a rank's compute, activations and messages by cp and
ZeRO's shards by dp·cp; its own traffic is left out (free), which keeps the bounds below the simulator's.
tests/sim/test_search.py checks both bounds against the simulator on random plans.
"""
from __future__ import annotations

from functools import lru_cache

from sim.cost.cost_model import CostModel
from sim.cost.flops import attention_core_flops, head_forward_flops, layer_elementwise_bytes, layer_flops
from sim.cost.work import Adam, Collective, Compute, Copy
from sim.step import frameworks, zeropp
from sim.step.memory_timeline import static_bytes
from zero_ref.memory import recipe
from zero_ref.parallel.schedules import warmup_count


def _width(plan) -> int:
    return 2 if recipe(plan.precision).name == "fp32" else 1  # 32-bit activations and messages


def _is_zero3_gathering(plan) -> bool:
    return plan.zero_stage == 3 and (plan.dp * plan.cp > 1 or plan.offload_param != "none")


@lru_cache(maxsize=4096)
def _layer_activations(model, batch, tp, sp, recompute, width, attention) -> float:
    return width * model.activation_terms(batch, tp=tp, sp=sp, recompute=recompute, attention=attention).total


def memory_lower_bound(model, plan) -> dict[str, float]:
    """Bytes one GPU provably holds at some instant of the step, by part, and per rank on the host tiers.

    Returns {'states', 'activations', 'transient', 'total', 'cpu', 'nvme'}: 'total' (GPU) ≤ the
    simulator's peak; 'cpu' and 'nvme' are the offloaded states per rank (exact).
    """
    static = static_bytes(model, plan)
    states = sum(static["gpu"].values())
    p, v, m = plan.pp, plan.virtual, plan.num_microbatches
    b, tp, sp, rc = plan.micro_batch_size, plan.tp, plan.sequence_parallel, plan.recompute
    act = lambda r: _layer_activations(model, b, tp, sp, r, _width(plan), plan.attention) / plan.cp
    per_chunk = model.layers // (p * v)
    in_flight = min(warmup_count(plan.schedule, p, m, 0, v) + 1, v * m)
    activations = in_flight * per_chunk * act(rc)
    transient = 0.0
    if rc != "none":  # the backward re-materialises a layer on top of what is stored
        transient += act("none") - (act(rc) if rc == "selective" else 0)
    r = recipe(plan.precision)
    layer_params = model.num_params / (tp * model.layers)
    if _is_zero3_gathering(plan):
        transient += layer_params * r.bytes_per_param("params")
    if plan.zero_stage >= 2 and plan.dp * plan.cp > 1:
        transient += layer_params * r.bytes_per_param("grads")
    return {"states": states, "activations": activations, "transient": transient,
            "total": states + activations + transient,
            "cpu": sum(static["cpu"].values()), "nvme": sum(static["nvme"].values())}


def _zeropp_kernel_bytes(model, plan) -> tuple[float, float]:
    """HBM bytes ZeRO++'s (de)quantize kernels add to one forward and one backward of a model chunk at least
    (sim.step.lowering adds them to the compute that uses each gather: qwZ's per gather, each counted over the
    widest group, qgZ's per backward); 0 where the simulator adds none."""
    dp = plan.dp * plan.cp
    if not (plan.zeropp and _is_zero3_gathering(plan) and dp > 1) or plan.schedule == "zb-h1":
        return 0.0, 0.0
    r = recipe(plan.precision)
    chunk = model.num_params / (plan.tp * plan.pp * plan.virtual)
    gather = zeropp.gather_kernel_bytes(plan, chunk, r.bytes_per_param("params"), dp)  # the widest group: fewest
    gathers_backward = not frameworks.keeps_gathered(plan)
    reduce = zeropp.reduce_kernel_bytes(plan, chunk, r.bytes_per_param("grads")) \
        if plan.zero_quantized_gradients else 0.0
    return gather, gather * gathers_backward + reduce


def time_lower_bound(model, cluster, plan, costs=None, *, granularity: int | None = None,
                     head: bool = True, cost_model: CostModel | None = None) -> float:
    """Seconds the simulated step takes at least (see the module docstring).

    ``granularity``: layers per node of the graph the step would be simulated with (it sets how
    many ZeRO-3 gathers and copies there are); None counts one per model chunk (the fewest).
    ``cost_model``: a CostModel of the same cluster, costs, tp, pp, dp and precision, to reuse.
    """
    cm = cost_model or CostModel(cluster, plan, costs)
    d = cm.duration
    p, v, m, tp, b = plan.pp, plan.virtual, plan.num_microbatches, plan.tp, plan.micro_batch_size
    rc, sp, width, cp = plan.recompute, plan.sequence_parallel, _width(plan), plan.cp
    dp = plan.dp * cp  # the ranks holding the same parameters
    n = model.layers // (p * v)  # layers per model chunk
    (fwd, fwd_a), (bwd, bwd_a) = ((g / (tp * cp), a / (tp * cp))
                                  for g, a in layer_flops(model, b, rc, plan.attention, plan.recompute_gemms).values())
    ew = {k: x / cp for k, x in layer_elementwise_bytes(model, b, tp=tp, sp=sp, width=width,
                                                         attention=plan.attention).items()}
    ew_b = ew["backward"] + {"none": 0.0, "selective": ew["attention_core"], "full": ew["forward"]}[rc]
    k_f, k_b = _zeropp_kernel_bytes(model, plan)
    f_c = d(Compute(n * fwd, n * ew["forward"] + k_f, n * fwd_a))
    b_c = d(Compute(n * bwd, n * ew_b + k_b, n * bwd_a))
    if tp > 1:
        msg = 2 * width * b * model.seq * model.hidden / cp
        op, per_layer = ("all_gather", 4) if sp else ("all_reduce", 2)
        f_c += d(Collective(op, msg, "tp", per_layer * n))
        b_c += d(Collective(op, msg, "tp", per_layer * n * (2 if rc == "full" else 1)))
    hf = head_forward_flops(model, b) / (tp * cp) if head else 0.0
    head_time = m * (d(Compute(hf)) + d(Compute(2 * hf)))
    send = d(Collective("p2p", 2 * width * b * model.seq * model.hidden / (tp * cp), "pp")) if p > 1 else 0.0
    chain = max(s * (f_c + b_c + 2 * send) + v * m * (f_c + b_c) + (head_time if s == p - 1 else 0.0)
                for s in range(p))
    if plan.schedule == "zb-h1":  # W passes (a layer's weight GEMMs: its forward less the attention core) may trail
        core = 0.0 if plan.attention == "flash" else attention_core_flops(model, b) / (tp * cp)  # flash: not in fwd
        w_c = d(Compute(n * (fwd - core)))
        w_last = w_c + d(Compute(hf))  # the last stage's W also holds one head GEMM
        chain = max(s * (f_c + send) + m * (f_c + b_c) + (head_time if s == p - 1 else 0.0)
                    + max(0.0, s * (b_c - w_c + send) - (min(s, m) + 1) * (w_last if s == p - 1 else w_c))
                    for s in range(p))

    r = recipe(plan.precision)
    pb, gb = r.bytes_per_param("params"), r.bytes_per_param("grads")
    params = model.num_params / (tp * p)                    # on one rank of one stage
    shard = params / plan.shard_group if plan.zero_stage >= 1 else params
    optimizer = d(Adam(shard, "gpu" if plan.offload_optimizer == "none" else "cpu"))
    if frameworks.gathers_after_step(plan) and dp > 1 and not frameworks.gathers_in_next_forward(plan):
        # the updated parameters are all-gathered after the update
        optimizer = max(optimizer, d(Collective("all_gather", params * pb, "dp")))
    bound = chain + optimizer

    # The DP stream runs one collective at a time: its busy time bounds the step too. Every
    # backward of ZeRO-2/3 reduces its chunk's gradients with its framework's collectives (in
    # buckets: at least one α each); ZeRO-3 gathers every group of every op's chunk (FSDP2 without
    # reshard_after_forward: of the forwards only).
    if dp > 1:
        chunk = params / v
        reduce = sum(d(w) for w in (zeropp.grad_reduce(plan, chunk) if plan.zero_quantized_gradients
                                    else frameworks.grad_reduce(plan, chunk, gb)))
        if plan.zero_stage >= 2:
            bound = max(bound, v * m * reduce)
        if _is_zero3_gathering(plan):
            gl = n if granularity is None else granularity
            groups = n // gl
            gathers = 1 if frameworks.keeps_gathered(plan) else 2
            gather = d(Collective("all_gather", chunk / groups * pb, frameworks.gather_axis(plan)))
            busy = v * m * (gathers * groups * gather + reduce)
            if plan.zeropp:  # ZeRO++: per step, each group's first gather from the primary, the rest (hpZ) not
                first, later = (d(zeropp.gather(plan, chunk / groups, pb, primary)[0]) for primary in (True, False))
                busy = v * groups * first + (v * m * gathers - v) * groups * later + v * m * reduce
            bound = max(bound, busy)
    if _is_zero3_gathering(plan) and plan.offload_param != "none":  # parameter copies, one at a time
        gl = n if granularity is None else granularity
        fetches, group = 2 * v * m * (n // gl), params / (v * (n // gl))
        bound = max(bound, fetches * d(Copy("h2d", group / dp * pb)))
        if plan.offload_param == "nvme":
            bound = max(bound, fetches * d(Copy("nvme_read", group / dp * pb)))
    return bound
