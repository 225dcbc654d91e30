"""Data-parallel bytes one rank sends per optimizer step, in closed form, by framework and ZeRO stage.

Ring collectives over n ranks: an all-reduce of S bytes sends 2(n−1)/n·S per rank, a
reduce-scatter or all-gather (n−1)/n·S (zero_ref.comm.ring_wire_bytes). With Ψ parameters,
m micro-steps (gradient accumulation) and f = (n−1)/n:

    paper (Rajbhandari et al. §7)  stages 0–2: 2Ψf        stage 3: 3Ψf   (one micro-step: m ignored)
    deepspeed 0.19.8               stage 0: 2Ψf  stage 1: 3Ψf  stage 2: (2m + 1)Ψf  stage 3: 3mΨf
    megatron                       stages 0–1: 2Ψf (stage 1: the distributed optimizer)
    fsdp2                          3mΨf, 2mΨf without reshard_after_forward; HSDP adds the
                                   all-reduce of each shard across the replicas

DeepSpeed's stages 1–2 all-reduce each gradient bucket and keep their slice
(runtime/zero/stage_1_and_2.py, ``DeepSpeedZeroOptimizer.average_tensor`` →
``allreduce_and_scatter``, ``use_multi_rank_bucket_allreduce`` True by default) and then
all-gather the updated parameters (``step`` → runtime/utils.py ``all_gather_dp_groups``): 1.5×
the paper's 2Ψ, which reduce-scatters. sim.step.frameworks cites the others.
Per-term bytes: ``param_bytes`` per gathered parameter, ``grad_bytes`` per reduced gradient
(FSDP2: its reduce dtype). zero_ref's own stages issue the paper's collectives.
"""
from __future__ import annotations

FRAMEWORKS = ("deepspeed", "megatron", "fsdp2", "paper")


def dp_bytes_per_step(num_params: float, *, zero_stage: int, dp: int, framework: str = "deepspeed",
                      micro_steps: int = 1, param_bytes: int = 2, grad_bytes: int = 2,
                      reshard_after_forward: bool = True, dp_shard: int = 0) -> float:
    """Bytes one rank sends over data parallelism per optimizer step (see the module docstring)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}; got {framework!r}")
    if zero_stage not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    for name, value in (("dp", dp), ("micro_steps", micro_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    m, psi = micro_steps, num_params
    if framework == "fsdp2":
        n = dp_shard or dp
        f = (n - 1) / n
        gathers = 2 if reshard_after_forward else 1
        replicas = dp // n
        across = 2 * (replicas - 1) / replicas * psi / n * grad_bytes
        return m * (gathers * f * psi * param_bytes + f * psi * grad_bytes + across)
    f = (dp - 1) / dp
    if framework == "megatron" and zero_stage > 1:
        raise ValueError("Megatron-Core's distributed optimizer is zero_stage 1; use 'deepspeed' or 'fsdp2'")
    if zero_stage == 0:
        return 2 * f * psi * grad_bytes
    if zero_stage == 3:
        return (1 if framework == "paper" else m) * f * psi * (2 * param_bytes + grad_bytes)
    if framework in ("paper", "megatron"):
        return f * psi * (grad_bytes + param_bytes)
    reduces = m if zero_stage == 2 else 1
    return f * psi * (2 * reduces * grad_bytes + param_bytes)


def zeropp_cross_node_bytes(num_params: float, *, dp: int, node: int, quantized_weights: bool = True,
                            hpz: bool = True, quantized_gradients: bool = True) -> float:
    """Bytes one rank sends across nodes per step under ZeRO++ (Wang et al. 2023, §4; one micro-step, fp16
    parameters and gradients, ``dp`` ranks in nodes of ``node``, scales and padding left out).

    ZeRO-3 sends 2Ψf (forward's gathers) + 2Ψf (backward's) + 2Ψf (reduce-scatter), f = (n−1)/n: the paper's 3M,
    M = 2Ψ. qwZ halves both gathers (int8); hpZ keeps backward's in the node (0); qgZ's second all-to-all sends
    int4 partial sums of 1/node of the gradient to the other nodes: (M−1)/M · Ψ/(2·node) per rank, M = dp/node
    nodes (its first all-to-all stays in the node). All three: Ψf + 0 + ≈Ψ/(2·node) per rank: the paper's
    3M → 0.5M (each rank's gathers) + 0 + 0.25M (qgZ: Ψ/2 bytes leave each node, its ranks together) = 0.75M.
    """
    if dp % node:
        raise ValueError(f"node={node} must divide dp={dp} (ranks per node)")
    f, m = (dp - 1) / dp, dp // node
    gather = f * num_params * (1 if quantized_weights else 2)
    backward = 0.0 if hpz and node > 1 else gather
    if not quantized_gradients:
        return gather + backward + 2 * f * num_params
    return gather + backward + (m - 1) / m * num_params / (2 * node)
