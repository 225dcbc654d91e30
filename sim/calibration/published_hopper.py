"""Published H100 training runs as data, each with its source; see sim.calibration.published for the A100/V100 rows.

LLAMA 3 — Llama Team, AI @ Meta, "The Llama 3 Herd of Models" (arXiv 2407.21783). Table 3: the
405B has 126 layers, model dimension 16,384, FFN dimension 53,248, 128 attention heads, 8
key/value heads, SwiGLU, vocabulary 128,000, RoPE. §3.3.1: H100 80 GB HBM3 at 700 W, eight per
server on NVLink, 400 Gbps per GPU between servers (RoCE). Table 4 ("Scaling configurations and
MFU for each stage of Llama 3 405B pre-training"): 8,192 GPUs with TP 8, CP 1, PP 16, DP 64,
sequence 8,192, batch size per DP 32, 16M tokens per batch, 430 TFLOPs/GPU, BF16 MFU 43 %;
16,384 GPUs with DP 128, batch size per DP 16, 400 TFLOPs/GPU, 41 %. §3.3.2: DP is FSDP that
shards optimizer states and gradients and keeps the parameters gathered from the forward to the
backward (so one parameter all-gather and one gradient reduce-scatter per step: ZeRO-1's
traffic), an interleaved pipeline schedule, one Transformer layer taken from the first and the
last stage so that "the first model chunk on the first stage has only the embedding, and the
last model chunk on the last stage has only output projection and loss" — chunks of one layer:
126 layers + those two chunks = 128 = 16 stages × 8 chunks, and "we could pre-train Llama 3 on
sequences of 8K tokens without activation checkpointing". Table 4's third row (16,384 GPUs, TP 8,
CP 16, PP 16, sequence 131,072, 16M tokens per batch, 380 TFLOPs/GPU, 38 %) is ``LLAMA3_405B_CP``,
held out of every fit (not in ``HOPPER``): DP = 16,384 / (8 · 16 · 16) = 8 with 16 sequences per
DP group. §3.3.2 gathers K and V over the CP group (an all-gather, then attention over the local
queries); the row is simulated as ring attention, which sends the same K/V bytes in the forward.

NEMOTRON-4 15B — Parmar et al., "Nemotron-4 15B Technical Report" (arXiv 2402.16819). Table 1: 32
layers, hidden 6144, 48 attention heads, 8 KV heads, sequence 4096, vocabulary 256,000; §2:
RoPE, squared-ReLU MLP, no biases, dropout 0, untied embeddings, "3.2 billion embedding parameters
and 12.5 billion non-embedding parameters" (which gives an MLP width of 4 × 6144 = 24576: the FFN
width is not printed); pre-training on 384 DGX H100 nodes (NVLink 450 GB/s per direction, 8 × 400
Gbps InfiniBand per node), 8-way tensor parallelism × data parallelism with a distributed optimizer
(ZeRO-1). Table 2 (batch ramp): DP 96 / 192 / 288 on 768 / 1,536 / 2,304 GPUs, batch 384 / 768 /
1,152, iteration 0.57 / 0.58 / 0.64 s, MFU 34.3 / 33.3 / 30.5 %. A squared-ReLU MLP has the FLOPs,
parameters and element-wise passes of a two-matrix GeLU MLP of the same width (``gated=False``).

Not used: Nemotron-4 340B (arXiv 2406.11704) — its batch-ramp table (DP, GPUs, iteration time,
MFU) is not in any text we could read (only secondary accounts of its 6,144-GPU row).

Every row's TFLOP/s and MFU count model FLOPs (``flops='sim'``: sim.cost.flops.model_flops_per_step,
PaLM's count the papers cite); tests/sim/test_published.py checks that each reported MFU follows
from the reported time or TFLOP/s at the H100's 989 TFLOP/s within 2 %.
"""
from __future__ import annotations

from dataclasses import replace

from sim.calibration.published_run import PublishedRun

LLAMA3 = "Llama Team 2024, arXiv 2407.21783"
NEMOTRON15 = "Parmar et al. 2024, arXiv 2402.16819"
H100_PEAK = 989e12

_LLAMA3_405B = (("ffn", 53248), ("gated", True), ("norm", "rmsnorm"), ("kv_heads", 8), ("dropout", False),
                ("bias", False), ("tied", False))


def _llama3(gpus, dp, per_dp, tflops, mfu):
    return PublishedRun(
        f"llama3-405B-{gpus}",
        f"{LLAMA3}: Table 4 row '{gpus:,} GPUs, TP 8, CP 1, PP 16, DP {dp}, batch size/DP {per_dp}' "
        f"({tflops} TFLOPs/GPU, BF16 MFU {mfu:.0%}); shape Table 3; parallelism §3.3.2",
        126, 16384, 128, gpus, 8, 16, dp * per_dp, 1, "none", sequence_parallel=True, virtual=8,
        tflops_per_gpu=tflops, flops="sim", seq=8192, vocab=128000, gpu="H100-80GB", zero_stage=1,
        precision="bf16", overlap_dp=True, positions="rotary", family="h100", shape=_LLAMA3_405B,
        attention="flash", pipeline_layers=128, reported=(("mfu", mfu),),
        assumptions="micro-batch 1 (the batch per DP group in micro-batches of one sequence); Megatron's "
                    "interleaved 1F1B with 8 one-layer chunks per stage for Meta's schedule; the embedding-only "
                    "and output-only chunks simulated as a layer each (128 simulated layers: about 1.5 % more "
                    "work on the pipeline's path than the run had); FSDP as ZeRO-1 with the gradient reduction "
                    "overlapped with the backward; sequence parallelism within TP; FlashAttention; no "
                    "recomputation (§3.3.2); RoCE 400 Gbps per GPU as the H100 preset's 400 GB/s per node")


def _nemotron15(dp, batch, time, mfu):
    gpus = 8 * dp
    return PublishedRun(
        f"nemotron4-15B-{gpus}",
        f"{NEMOTRON15}: Table 2 row 'DP {dp}, {gpus:,} GPUs, batch {batch}' ({time} s per iteration, MFU "
        f"{mfu:.1%}); shape Table 1 and §2",
        32, 6144, 48, gpus, 8, 1, batch, batch // dp, "none", sequence_parallel=True, iteration_time=time,
        flops="sim", seq=4096, vocab=256000, gpu="H100-80GB", zero_stage=1, precision="bf16", overlap_dp=True,
        positions="rotary", family="h100", attention="flash", reported=(("mfu", mfu),),
        shape=(("ffn", 24576), ("kv_heads", 8), ("dropout", False), ("bias", False), ("tied", False)),
        assumptions="MLP width 24576 (from the 12.5B non-embedding parameters); squared ReLU as a two-matrix "
                    "MLP; one micro-batch of batch/DP = 4 sequences per step; the distributed optimizer as "
                    "ZeRO-1 with the gradient reduction overlapped with the backward; sequence parallelism; "
                    "FlashAttention; no recomputation")


LLAMA3_405B = (_llama3(8192, 64, 32, 430, 0.43), _llama3(16384, 128, 16, 400, 0.41))
LLAMA3_405B_CP = (replace(
    _llama3(16384, 8 * 16, 16, 380, 0.38), name="llama3-405B-16384-cp16", seq=131072, global_batch=8 * 16, cp=16,
    source=f"{LLAMA3}: Table 4 row '16,384 GPUs, TP 8, CP 16, PP 16, sequence 131,072, 16M tokens per batch' "
           "(380 TFLOPs/GPU, BF16 MFU 38%); shape Table 3; parallelism §3.3.2",
    assumptions="DP 8 (16,384 GPUs / TP 8 × CP 16 × PP 16), 16 sequences of 131,072 tokens per DP group in "
                "micro-batches of one; CP 16 as ring attention (§3.3.2's all-gather of K and V sends the same "
                "forward bytes); no recomputation (a rank holds 8,192 tokens, as in the 8K stage); otherwise as "
                "the 8K rows"),)
NEMOTRON4_15B = (_nemotron15(96, 384, 0.57, 0.343), _nemotron15(192, 768, 0.58, 0.333),
                 _nemotron15(288, 1152, 0.64, 0.305))
HOPPER = LLAMA3_405B + NEMOTRON4_15B
