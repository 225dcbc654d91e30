"""Published H100 runs of the frameworks' own benchmark tables, as data, each with its source.

LLM-FOUNDRY — mosaicml/llm-foundry, scripts/train/benchmarking/README.md at commit
8c8dd48f72168c5d51e2f7b151595892a8fba43d, tables "H100 80GB BF16 (Large Scale, >= 128 GPUs)" and
"H100 80GB BF16": MPT models trained with Composer's PyTorch FSDP (FULL_SHARD or SHARD_GRAD_OP as
the row says), amp_bf16, FlashAttention (``attn_impl: flash``), activation checkpointing as the row
says, columns SeqLen, # GPUs, MicroBatchSize, GradAccum, GlobalBatchSize and Throughput (T/s/GPU).
Shapes from scripts/train/yamls/pretrain/mpt-*.yaml (d_model, n_heads, n_layers, expansion_ratio 4,
vocab 50368); MPTConfig's defaults: learned positions (a max_seq_len × d_model table: NumParams
grows with SeqLen), biases and LayerNorm biases, no dropout; submit_benchmarks.py sets
``low_precision_layernorm``; the optimizer config clips gradients at 1.0. The step time is
GlobalBatchSize × SeqLen / (T/s/GPU × GPUs); tests check NumParams and the MFU column against the
shapes (``reported``).

TORCHTITAN — pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md at commit
b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (the runs: torchtitan 9dec370, torch 1963fc8, Dec 2024):
Llama 3.1 8B, FSDP2 over all GPUs, local batch 2, selective activation checkpointing, Table 1 (8 GPUs)
and Table 3 (128 GPUs), rows "FSDP" (eager) and "FSDP + torch.compile"; sequence 8192 from
train_configs/llama3_8b.toml at 9dec370 (``seq_len = 8192``, ``selective_ac_option = 'op'``).
The GPUs are Grand Teton H100s with 96 GB of HBM2e at 2.4 TB/s and a 500 W power limit (the file
says their peak is "between SXM and NVL" and unknown): the rows run on the H100 preset with HBM
at 2.4 TB/s, 96 GiB, and a peak midway between the SXM5's 989 and the NVL's 835 TFLOP/s.

FP8 (family 'fp8', ``Plan.fp8``: GEMMs at ``Costs.fp8_efficiency`` of twice the 16-bit peak;
attention, element-wise kernels, collectives and memory as in bf16): llm-foundry's "H100 80GB FP8"
table (Transformer Engine linears), torchtitan's "+ Float8" rows (torchao), its Table 2 (context
parallelism 2-8 up to 262,144 tokens) and Table 4's 70B without async TP, and NVIDIA NeMo's
performance summary at NeMo commit 9c5c5e9709, docs/source/performance/performance_summary.md
(NeMo 24.07, DGX-H100: the pretraining table is FP8 throughout; its Llama 3 rows use CP 2). FP8
all-gathers (torchtitan's enable_fsdp_float8_all_gather is off in these tables) are not modelled.

Rows not expressible (``NOT_EXPRESSIBLE``, with the reason): async TP (torchtitan's Table 4 second
row and its 405B Tables 5-6); the newer NeMo/Megatron-Bridge tables' H100 rows (MoE, or FP8
recipes whose recomputation and overlap settings are not in the tables).
"""
from __future__ import annotations

from dataclasses import replace

from sim.calibration.published_run import PublishedRun
from sim.cost.flops import op_sac_share
from sim.spec.model import Model

FOUNDRY = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md "
           "@8c8dd48f72168c5d51e2f7b151595892a8fba43d")
TITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md @b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"

# MPT shapes (n_layers, d_model, n_heads): scripts/train/yamls/pretrain/mpt-<size>.yaml
MPT = {"760m": (24, 1536, 12), "1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32),
       "13b": (40, 5120, 40), "30b": (48, 7168, 56), "70b": (80, 8192, 64)}
_MPT_SHAPE = (("dropout", False),)

LARGE, SMALL = "H100 80GB BF16 (Large Scale, >= 128 GPUs)", "H100 80GB BF16"
# (table, model, SeqLen, # GPUs, MFU %, MicroBatchSize, GradAccum, GlobalBatchSize, T/s/GPU,
#  sharding, activation checkpointing, NumParams) as the README prints them
FOUNDRY_TABLE = (
    (LARGE, "70b", 2048, 512, 41.25, 8, 1, 4096, 1007, "FULL_SHARD", True, 64862437376),
    (LARGE, "70b", 2048, 256, 42.42, 8, 1, 2048, 1035, "FULL_SHARD", True, 64862437376),
    (LARGE, "70b", 2048, 128, 43.36, 8, 1, 1024, 1058, "FULL_SHARD", True, 64862437376),
    (LARGE, "30b", 2048, 512, 40.27, 8, 1, 4096, 2115, "FULL_SHARD", True, 29975214080),
    (LARGE, "30b", 2048, 256, 40.89, 8, 1, 2048, 2148, "FULL_SHARD", True, 29975214080),
    (LARGE, "30b", 2048, 128, 41.85, 8, 1, 1024, 2199, "FULL_SHARD", True, 29975214080),
    (LARGE, "13b", 2048, 512, 41.12, 16, 1, 8192, 4952, "FULL_SHARD", True, 12853954560),
    (LARGE, "13b", 2048, 256, 41.42, 16, 1, 4096, 4989, "FULL_SHARD", True, 12853954560),
    (LARGE, "13b", 2048, 128, 42.18, 16, 1, 2048, 5080, "FULL_SHARD", True, 12853954560),
    (LARGE, "7b", 2048, 512, 42.2, 6, 1, 3072, 9670, "FULL_SHARD", False, 6658859008),
    (LARGE, "7b", 2048, 256, 44.15, 6, 1, 1536, 10119, "FULL_SHARD", False, 6658859008),
    (LARGE, "7b", 2048, 128, 45.71, 6, 1, 768, 10475, "FULL_SHARD", False, 6658859008),
    (LARGE, "3b", 2048, 512, 39.24, 8, 1, 4096, 21664, "SHARD_GRAD_OP", False, 2651837440),
    (LARGE, "3b", 2048, 256, 41.25, 8, 1, 2048, 22772, "SHARD_GRAD_OP", False, 2651837440),
    (LARGE, "3b", 2048, 128, 42.43, 8, 1, 1024, 23422, "SHARD_GRAD_OP", False, 2651837440),
    (LARGE, "1b", 2048, 512, 36.65, 12, 1, 6144, 39837, "SHARD_GRAD_OP", False, 1315950592),
    (LARGE, "1b", 2048, 256, 39.15, 12, 1, 3072, 42555, "SHARD_GRAD_OP", False, 1315950592),
    (LARGE, "1b", 2048, 128, 40.6, 12, 1, 1536, 44123, "SHARD_GRAD_OP", False, 1315950592),
    (SMALL, "70b", 2048, 64, 42.57, 8, 4, 2048, 1039, "FULL_SHARD", True, 64862437376),
    (SMALL, "70b", 2048, 32, 36.15, 2, 16, 1024, 882, "FULL_SHARD", True, 64862437376),
    (SMALL, "30b", 8192, 8, 29.92, 1, 21, 168, 1384, "FULL_SHARD", True, 30019254272),
    (SMALL, "30b", 4096, 8, 35.86, 1, 21, 168, 1802, "FULL_SHARD", True, 29989894144),
    (SMALL, "30b", 2048, 32, 43.92, 14, 3, 1344, 2308, "FULL_SHARD", True, 29975214080),
    (SMALL, "30b", 2048, 16, 43.07, 10, 3, 480, 2263, "FULL_SHARD", True, 29975214080),
    (SMALL, "30b", 2048, 8, 38.11, 3, 21, 504, 2002, "FULL_SHARD", True, 29975214080),
    (SMALL, "30b", 1024, 8, 38.76, 6, 21, 1008, 2084, "FULL_SHARD", True, 29967874048),
    (SMALL, "13b", 32768, 8, 31.68, 1, 3, 24, 1976, "FULL_SHARD", True, 13011240960),
    (SMALL, "13b", 16384, 8, 35.55, 3, 3, 72, 2985, "FULL_SHARD", True, 12927354880),
    (SMALL, "13b", 4096, 8, 41.6, 10, 3, 240, 4717, "FULL_SHARD", True, 12864440320),
    (SMALL, "13b", 2048, 64, 39.86, 2, 1, 128, 4800, "FULL_SHARD", False, 12853954560),
    (SMALL, "13b", 2048, 32, 39.95, 2, 1, 64, 4811, "FULL_SHARD", False, 12853954560),
    (SMALL, "13b", 2048, 16, 39.58, 2, 1, 32, 4767, "FULL_SHARD", False, 12853954560),
    (SMALL, "13b", 2048, 8, 39.79, 2, 1, 16, 4792, "FULL_SHARD", False, 12853954560),
    (SMALL, "13b", 1024, 8, 44.27, 40, 3, 960, 5502, "FULL_SHARD", True, 12848711680),
    (SMALL, "7b", 65536, 8, 28.59, 1, 2, 16, 1956, "FULL_SHARD", True, 6918905856),
    (SMALL, "7b", 32768, 8, 30.94, 2, 2, 32, 3318, "FULL_SHARD", True, 6784688128),
    (SMALL, "7b", 8192, 8, 37.14, 8, 2, 128, 6935, "FULL_SHARD", True, 6684024832),
    (SMALL, "7b", 4096, 8, 40.42, 16, 2, 256, 8611, "FULL_SHARD", True, 6667247616),
    (SMALL, "7b", 2048, 8, 46.44, 6, 1, 48, 10643, "FULL_SHARD", False, 6658859008),
    (SMALL, "7b", 1024, 8, 42.83, 64, 2, 1024, 10203, "FULL_SHARD", True, 6654664704),
    (SMALL, "3b", 65536, 8, 26.81, 1, 2, 16, 3262, "FULL_SHARD", True, 2814366720),
    (SMALL, "3b", 32768, 8, 28.84, 3, 6, 144, 5873, "FULL_SHARD", True, 2730480640),
    (SMALL, "3b", 16384, 8, 36.34, 1, 6, 48, 11152, "FULL_SHARD", False, 2688537600),
    (SMALL, "3b", 8192, 8, 40.31, 3, 6, 144, 16578, "FULL_SHARD", False, 2667566080),
    (SMALL, "3b", 4096, 8, 42.31, 5, 6, 240, 20964, "FULL_SHARD", False, 2657080320),
    (SMALL, "3b", 2048, 64, 40.8, 6, 3, 1152, 22525, "FULL_SHARD", False, 2651837440),
    (SMALL, "3b", 2048, 32, 41.7, 6, 3, 576, 23021, "FULL_SHARD", False, 2651837440),
    (SMALL, "3b", 2048, 16, 43.73, 10, 3, 480, 24142, "FULL_SHARD", False, 2651837440),
    (SMALL, "3b", 1024, 8, 46.2, 20, 6, 960, 27046, "FULL_SHARD", False, 2649216000),
    (SMALL, "3b", 512, 8, 46.32, 40, 6, 1920, 27965, "FULL_SHARD", False, 2647905280),
    (SMALL, "1b", 65536, 8, 26.34, 1, 2, 16, 5506, "FULL_SHARD", True, 1445974016),
    (SMALL, "1b", 32768, 8, 33.54, 1, 4, 32, 12025, "FULL_SHARD", False, 1378865152),
    (SMALL, "1b", 16384, 8, 35.22, 2, 4, 64, 19649, "FULL_SHARD", False, 1345310720),
    (SMALL, "1b", 8192, 8, 37.73, 3, 4, 96, 29157, "FULL_SHARD", False, 1328533504),
    (SMALL, "1b", 4096, 8, 40.26, 7, 4, 224, 38535, "FULL_SHARD", False, 1320144896),
    (SMALL, "1b", 2048, 64, 40.85, 20, 1, 1280, 44402, "FULL_SHARD", False, 1315950592),
    (SMALL, "1b", 2048, 32, 41.52, 20, 1, 640, 45130, "FULL_SHARD", False, 1315950592),
    (SMALL, "1b", 2048, 16, 42.36, 20, 1, 320, 46037, "FULL_SHARD", False, 1315950592),
    (SMALL, "1b", 2048, 8, 41.82, 14, 1, 112, 45455, "FULL_SHARD", False, 1315950592),
    (SMALL, "1b", 1024, 8, 41.95, 18, 4, 576, 48910, "FULL_SHARD", False, 1313853440),
    (SMALL, "1b", 512, 8, 43.21, 56, 4, 1792, 52275, "FULL_SHARD", False, 1312804864),
    (SMALL, "760m", 32768, 8, 31.84, 1, 2, 16, 16291, "FULL_SHARD", False, 807656448),
    (SMALL, "760m", 16384, 8, 33.57, 3, 2, 48, 27815, "FULL_SHARD", False, 782490624),
    (SMALL, "760m", 8192, 8, 34.84, 6, 2, 96, 41825, "FULL_SHARD", False, 769907712),
    (SMALL, "760m", 4096, 8, 35.83, 12, 2, 192, 55459, "FULL_SHARD", False, 763616256),
    (SMALL, "760m", 2048, 32, 37.57, 24, 1, 768, 67971, "FULL_SHARD", False, 760470528),
    (SMALL, "760m", 2048, 16, 37.89, 24, 1, 384, 68551, "FULL_SHARD", False, 760470528),
    (SMALL, "760m", 2048, 8, 34.9, 24, 2, 384, 63147, "FULL_SHARD", False, 760470528),
    (SMALL, "760m", 1024, 8, 39.76, 48, 2, 768, 78581, "FULL_SHARD", False, 758897664),
    (SMALL, "760m", 512, 8, 40.42, 96, 2, 1536, 83749, "FULL_SHARD", False, 758111232),
)


def _foundry(table, size, seq, gpus, mfu, mbs, accum, batch, tps, sharding, ckpt, params):
    layers, hidden, heads = MPT[size]
    return PublishedRun(
        f"mpt-{size}-s{seq}-{gpus}", f"{FOUNDRY}, table '{table}', row 'mpt {size}, SeqLen {seq}, {gpus} GPUs' "
        f"({tps} T/s/GPU, MFU {mfu} %); shape scripts/train/yamls/pretrain/mpt-{size}.yaml",
        layers, hidden, heads, gpus, 1, 1, batch, mbs, "full" if ckpt else "none", iteration_time=batch * seq / (tps * gpus),
        flops="sim", seq=seq, vocab=50368, gpu="H100-80GB", zero_stage=3, precision="bf16", family="fsdp",
        framework="fsdp2", reshard_after_forward=sharding == "FULL_SHARD", kernels="eager", shape=_MPT_SHAPE,
        backward_prefetch=False,
        attention="flash", reported=(("mfu", mfu / 100), ("num_params", params), ("tokens_per_gpu_s", tps)),
        assumptions=f"Composer's FSDP ({sharding}) modelled as FSDP2 with reshard_after_forward="
                    f"{sharding == 'FULL_SHARD'} and Composer's default backward_prefetch 'BACKWARD_POST' "
                    "(composer.utils.FSDPConfig; the next all-gather issued after a unit's backward); PyTorch eager kernels (no torch.compile); FlashAttention, causal; "
                    "activation checkpointing as full recomputation of each block; bf16 parameters in the "
                    "forward and backward (amp_bf16), fp32 master weights and Adam states sharded")


FOUNDRY_H100 = tuple(_foundry(*row) for row in FOUNDRY_TABLE)

# Llama 3.1 8B: 32 layers, 4096, 32 heads, 8 KV heads, FFN 14336, vocabulary 128256, untied, RMSNorm
_LLAMA8B = (("ffn", 14336), ("gated", True), ("norm", "rmsnorm"), ("kv_heads", 8), ("dropout", False),
            ("bias", False), ("tied", False))
# 500 W HBM2e H100: the file's footnote puts its peak "between SXM and NVL" (989 and 835 TFLOP/s): the midpoint
TITAN_PEAK = (989e12 + 835e12) / 2
_TITAN_NODE = (("hbm_bw", 2.4e12), ("hbm_bytes", 96 * 2**30), ("peak_flops", TITAN_PEAK))


def _titan(table, gpus, tps, compiled):
    return PublishedRun(
        f"torchtitan-llama3-8B-{gpus}{'-compile' if compiled else ''}",
        f"{TITAN}: {table} row 'FSDP{' + torch.compile' if compiled else ''}' ({tps:,} TPS/GPU)",
        32, 4096, 32, gpus, 1, 1, 2 * gpus, 2, "none", iteration_time=2 * 8192 / tps, flops="sim", seq=8192,
        vocab=128256, gpu="H100-80GB", node=_TITAN_NODE, zero_stage=3, precision="bf16", family="fsdp",
        framework="fsdp2", kernels="fused" if compiled else "eager", shape=_LLAMA8B, attention="flash",
        positions="rotary", reported=(("tokens_per_gpu_s", tps),),
        recompute_gemms=op_sac_share(Model("llama3-8B", 32, 4096, 32, 128256, 8192, **dict(_LLAMA8B))),
        assumptions="FSDP2 over all GPUs, reshard after forward; sequence 8192 (llama3_8b.toml); selective "
                    "activation checkpointing 'op' (parallelize_llama.py at 9dec370: every second matmul of a "
                    "block recomputed, k, o and w3: 37 % of its GEMMs, recompute_gemms; its element-wise "
                    "recomputation not modelled); "
                    "torch.compile as fused element-wise kernels; 500 W HBM2e H100s at 912 TFLOP/s, midway between "
                    "the SXM5's 989 and the NVL's 835 that the file's footnote brackets them by")


TORCHTITAN_H100 = (_titan("Table 1 (8 GPUs)", 8, 5762, False), _titan("Table 1 (8 GPUs)", 8, 6667, True),
                   _titan("Table 3 (128 GPUs)", 128, 5605, False), _titan("Table 3 (128 GPUs)", 128, 6514, True))

# llm-foundry's "H100 80GB FP8" table: (size, SeqLen, MFU %, MicroBatchSize, GradAccum, GlobalBatchSize, T/s/GPU,
# activation checkpointing, NumParams); 8 GPUs, FULL_SHARD, amp_fp8 (Transformer Engine's FP8 linears)
FOUNDRY_FP8_TABLE = (
    ("3b", 32768, 14.38, 3, 6, 144, 5856, True, 2730480640), ("3b", 8192, 23.28, 3, 6, 144, 19146, False, 2667566080),
    ("3b", 2048, 27.7, 10, 6, 480, 30586, False, 2651837440), ("3b", 512, 30.25, 40, 6, 1920, 36527, False, 2647905280),
    ("1b", 32768, 17.55, 1, 4, 32, 12580, False, 1378865152), ("1b", 8192, 20.71, 2, 4, 64, 32010, False, 1328533504),
    ("1b", 512, 29.06, 56, 4, 1792, 70315, False, 1312804864),
)


def _foundry_fp8(size, seq, mfu, mbs, accum, batch, tps, ckpt, params):
    run = _foundry("H100 80GB FP8", size, seq, 8, mfu, mbs, accum, batch, tps, "FULL_SHARD", ckpt, params)
    return replace(run, name=run.name + "-fp8", fp8=True, family="fp8",
                   assumptions=run.assumptions + "; amp_fp8: the GEMMs in FP8 (Transformer Engine), attention in bf16")


FOUNDRY_FP8 = tuple(_foundry_fp8(*row) for row in FOUNDRY_FP8_TABLE)

_LLAMA70B = (("ffn", 28672), ("gated", True), ("norm", "rmsnorm"), ("kv_heads", 8), ("dropout", False),
             ("bias", False), ("tied", False))
TORCHTITAN_FP8 = (
    replace(_titan("Table 1 (8 GPUs)", 8, 8532, True), name="torchtitan-llama3-8B-8-fp8", fp8=True, family="fp8",
            source=f"{TITAN}: Table 1 row 'FSDP + torch.compile + Float8' (8,532 TPS/GPU)"),
    replace(_titan("Table 3 (128 GPUs)", 128, 8380, True), name="torchtitan-llama3-8B-128-fp8", fp8=True,
            family="fp8", source=f"{TITAN}: Table 3 row 'FSDP + torch.compile + Float8' (8,380 TPS/GPU)"),
    PublishedRun(
        "torchtitan-llama3-70B-256-fp8", f"{TITAN}: Table 4 row '2D' (829 TPS/GPU; FSDP 32, TP 8, local batch 16, "
        "global batch 512, full activation checkpointing)", 80, 8192, 64, 256, 8, 1, 512, 16, "full",
        sequence_parallel=True, iteration_time=512 * 8192 / (829 * 256), flops="sim", seq=8192, vocab=128256,
        gpu="H100-80GB", node=_TITAN_NODE, zero_stage=3, precision="bf16", family="fp8", framework="fsdp2",
        kernels="fused", fp8=True, shape=_LLAMA70B, attention="flash", positions="rotary",
        reported=(("tokens_per_gpu_s", 829),),
        assumptions="Llama 3.1 70B, sequence 8192 (llama3_70b.toml); FSDP2 over 32 groups of TP 8 with sequence "
                    "parallelism, no async TP; one micro-batch of 16 sequences per rank; torch.compile as fused "
                    "kernels; Float8 linears (FP8 GEMMs); the peak as in Table 1"),
)

NEMO = "NVIDIA/NeMo docs/source/performance/performance_summary.md @9c5c5e9709 (NeMo 24.07, DGX-H100, FP8)"
_LLAMA2 = (("gated", True), ("norm", "rmsnorm"), ("dropout", False), ("bias", False), ("tied", False))
_NEMOTRON = (("dropout", False), ("bias", False), ("tied", False))
# name: (layers, hidden, heads, vocabulary, positions, shape) from NeMo's model configs (GPT-3: GPT-2's BPE padded
# to 50304; Llama 2: Touvron et al. 2023; Nemotron: squared-ReLU MLP 4h, as Nemotron-4 15B); tests check that the
# table's Model TFLOP/s/GPU follows from these shapes and its Tokens/s/GPU
NEMO_SHAPES = {
    "GPT3-5B": (24, 4096, 32, 50304, "learned", ()), "GPT3-20B": (44, 6144, 48, 50304, "learned", ()),
    "GPT3-175B": (96, 12288, 96, 50304, "learned", ()),
    "LLAMA2-7B": (32, 4096, 32, 32000, "rotary", _LLAMA2 + (("ffn", 11008),)),
    "LLAMA2-13B": (40, 5120, 40, 32000, "rotary", _LLAMA2 + (("ffn", 13824),)),
    "LLAMA2-70B": (80, 8192, 64, 32000, "rotary", _LLAMA2 + (("ffn", 28672), ("kv_heads", 8))),
    "Nemotron-8B": (32, 4096, 32, 256000, "rotary", _NEMOTRON),
    "Nemotron-22B": (40, 6144, 48, 256000, "rotary", _NEMOTRON),
    "Nemotron-340B": (96, 18432, 96, 256000, "rotary", _NEMOTRON + (("ffn", 73728), ("kv_heads", 8))),
}
# Pretraining table: Model, #-GPUs, GBS, MBS, Sequence Length, TP, PP, VP, Tokens/sec/GPU, Model TFLOP/sec/GPU (CP 1)
NEMO_TABLE = (
    ("GPT3-5B", 64, 2048, 4, 2048, 1, 1, 1, 23406, 765), ("GPT3-20B", 64, 256, 2, 2048, 2, 1, 1, 5851, 750),
    ("GPT3-175B", 128, 256, 1, 2048, 4, 8, 6, 716, 771), ("GPT3-175B", 512, 2048, 2, 2048, 4, 8, 6, 825, 888),
    ("LLAMA2-7B", 8, 128, 1, 4096, 1, 1, 1, 16934, 780), ("LLAMA2-13B", 16, 128, 1, 4096, 1, 4, 10, 8715, 760),
    ("LLAMA2-70B", 64, 128, 1, 4096, 4, 4, 20, 1728, 768), ("Nemotron-8B", 64, 256, 4, 4096, 2, 1, 1, 12507, 643),
    ("Nemotron-22B", 64, 256, 2, 4096, 2, 4, 10, 4312, 562), ("Nemotron-340B", 128, 32, 1, 4096, 8, 8, 12, 326, 686),
)


def _nemo(model, gpus, batch, mbs, seq, tp, pp, vp, tps, tflops):
    layers, hidden, heads, vocab, positions, shape = NEMO_SHAPES[model]
    return PublishedRun(
        f"nemo-{model}-{gpus}", f"{NEMO}: Pretraining row '{model}, {gpus} GPUs, GBS {batch}' ({tps} tokens/s/GPU, "
        f"{tflops} model TFLOP/s/GPU)", layers, hidden, heads, gpus, tp, pp, batch, mbs, "none",
        sequence_parallel=tp > 1, virtual=vp, iteration_time=batch * seq / (tps * gpus), flops="sim", seq=seq,
        vocab=vocab, gpu="H100-80GB", zero_stage=1, precision="bf16", overlap_dp=True, positions=positions,
        family="fp8", shape=shape, attention="flash", fp8=True,
        reported=(("tokens_per_gpu_s", tps), ("model_tflops_per_gpu", tflops)),
        assumptions="Megatron-Core under NeMo: Transformer Engine FP8 GEMMs, bf16 attention (fused, causal), "
                    "sequence parallelism with TP, the distributed optimizer as ZeRO-1 with the gradient "
                    "reduction overlapped, interleaved 1F1B where VP > 1, no recomputation; TP communication "
                    "overlap (userbuffers) not modelled: TP collectives block")


NEMO_FP8 = tuple(_nemo(*row) for row in NEMO_TABLE)

_LLAMA3 = (("gated", True), ("norm", "rmsnorm"), ("kv_heads", 8), ("dropout", False), ("bias", False), ("tied", False))
# the table's two rows with CP 2 (Llama 3 8B and 70B: sequence 8192, vocabulary 128256)
NEMO_CP_TABLE = (("LLAMA3-8B", 8, 128, 1, 8192, 1, 1, 2, 1, 12273, 711, 32, 4096, 32, 14336),
                 ("LLAMA3-70B", 64, 128, 1, 8192, 4, 4, 2, 5, 1524, 734, 80, 8192, 64, 28672))


def _nemo_cp(model, gpus, batch, mbs, seq, tp, pp, cp, vp, tps, tflops, layers, hidden, heads, ffn):
    return PublishedRun(
        f"nemo-{model}-{gpus}", f"{NEMO}: Pretraining row '{model}, {gpus} GPUs, GBS {batch}, CP {cp}' ({tps} "
        f"tokens/s/GPU, {tflops} model TFLOP/s/GPU)", layers, hidden, heads, gpus, tp, pp, batch, mbs, "none",
        sequence_parallel=tp > 1, virtual=vp, iteration_time=batch * seq / (tps * gpus), flops="sim", seq=seq,
        vocab=128256, gpu="H100-80GB", zero_stage=1, precision="bf16", overlap_dp=True, positions="rotary",
        family="fp8", shape=_LLAMA3 + (("ffn", ffn),), attention="flash", fp8=True, cp=cp, cp_kind="ring",
        reported=(("tokens_per_gpu_s", tps), ("model_tflops_per_gpu", tflops)),
        assumptions="as the other NeMo rows; context parallelism as Megatron-Core's ring (Transformer Engine's "
                    "p2p attention, zig-zag balanced)")


NEMO_CP = tuple(_nemo_cp(*row) for row in NEMO_CP_TABLE)

# torchtitan Table 2: FSDP + CP + torch.compile + Float8, Llama 3.1 8B on 8 GPUs, local batch 1, full checkpointing
TITAN_CP_TABLE = ((8, 1, 32768, 3890), (4, 2, 65536, 2540), (2, 4, 131072, 1071), (1, 8, 262144, 548))


def _titan_cp(fsdp, cp, seq, tps):
    return PublishedRun(
        f"torchtitan-llama3-8B-cp{cp}", f"{TITAN}: Table 2 row 'FSDP {fsdp}, CP {cp}, sequence {seq}' ({tps:,} "
        "TPS/GPU)", 32, 4096, 32, 8, 1, 1, fsdp, 1, "full", iteration_time=fsdp * seq / (tps * 8), flops="sim",
        seq=seq, vocab=128256, gpu="H100-80GB", node=_TITAN_NODE, zero_stage=3, precision="bf16", family="fp8",
        framework="fsdp2", kernels="fused", fp8=True, shape=_LLAMA8B, attention="flash", positions="rotary",
        cp=cp, cp_kind="ring", reported=(("tokens_per_gpu_s", tps),),
        assumptions="FSDP2 sharding over the FSDP × CP ranks; context parallelism as a ring (torch's "
                    "context_parallel, its default rotation all-gathers K/V: the same bytes); local batch 1 per "
                    "FSDP rank; full activation checkpointing; torch.compile; Float8 linears; the peak as in Table 1")


TORCHTITAN_CP = tuple(_titan_cp(*row) for row in TITAN_CP_TABLE)

TRAINY = ("pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md "
          "@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (torchtitan e7c0cae)")


def _trainy(nodes, tps):
    gpus = 8 * nodes
    return PublishedRun(
        f"torchtitan-llama3-8B-h200-{gpus}", f"{TRAINY}: Results row 'NUM_NODES {nodes}' ({tps} TPS/GPU)",
        32, 4096, 32, gpus, 1, 1, 2 * gpus, 2, "none", iteration_time=2 * 8192 / tps, flops="sim", seq=8192,
        vocab=128256, gpu="H200-141GB", zero_stage=3, precision="bf16", family="fp8", framework="fsdp2",
        kernels="fused", fp8=True, shape=_LLAMA8B, attention="flash", positions="rotary",
        recompute_gemms=op_sac_share(Model("llama3-8B", 32, 4096, 32, 128256, 8192, **dict(_LLAMA8B))),
        reported=(("tokens_per_gpu_s", tps),),
        assumptions="the file's command: local batch 2, torch.compile, Float8 linears; llama3_8b.toml at e7c0cae: "
                    "sequence 8192, selective checkpointing 'op' (every second matmul recomputed); FSDP2 over "
                    "all GPUs; its FP8 all-gathers modelled as bf16 ones; 8 H200 per node, 400 Gb/s per GPU "
                    "(the H200 preset)")


TORCHTITAN_H200 = (_trainy(4, 10938), _trainy(8, 10753))
FP8_H100 = FOUNDRY_FP8 + TORCHTITAN_FP8 + NEMO_FP8 + NEMO_CP + TORCHTITAN_CP + TORCHTITAN_H200

FRAMEWORKS_H100 = FOUNDRY_H100 + TORCHTITAN_H100 + FP8_H100

NOT_EXPRESSIBLE = (
    (f"{TITAN}, Table 4 row '2D + AsyncTP', Tables 5 and 6 (405B, 512 GPUs)", "async TP: the TP collectives "
     "decomposed into the GEMMs and overlapped with them; the simulator's TP collectives block"),
    (f"{FOUNDRY}, table 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'", "not H100 (out of scope here)"),
    ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary*.md, DGX-H100 rows", "MoE models (expert parallelism), "
     "FP8 current-scaling recipes whose recomputation and overlap settings the tables do not give"),
)
