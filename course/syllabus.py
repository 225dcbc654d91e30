"""The syllabus of ZeRO Lab as data: thirty chapters, in order.

This module is the single source for everything that names a chapter. The chapter
table in the README (``readme_table``, printed by ``python -m course.syllabus``) and the
first markdown cell of every notebook (``title_markdown``) are generated from it, and
the notebook file names come from ``Chapter.notebook``. Change a title or a goal here,
then regenerate; never edit the derived copies by hand.

Each chapter records its English and Chinese titles, three to five checkable learning
goals, which part of the seed course (the Chinese text in ``shared/seeds/``) it mirrors,
and which project modules it uses. The chapters follow the table in DESIGN.md §6.

Pure standard library: importing this module pulls in neither torch nor numpy.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ALLOWED_MODULES",
    "CHAPTERS",
    "Chapter",
    "by_slug",
    "chapter",
    "main",
    "readme_table",
    "title_markdown",
]

FIRST, LAST = 1, 30

#: The project modules a chapter may name in ``Chapter.modules`` (each one importable; ``zero_ref.launch``
#: is the launcher, zero_ref/launcher.py). tests/course/test_syllabus.py checks every chapter's notebook uses them.
ALLOWED_MODULES: frozenset[str] = frozenset(
    {
        "sim",
        "zero_ref.checkpoint",
        "zero_ref.ds.checkpointing",
        "zero_ref.collective_algorithms",
        "zero_ref.comm",
        "zero_ref.compression",
        "zero_ref.config",
        "zero_ref.config.batch",
        "zero_ref.config.schema",
        "zero_ref.diagnostics",
        "zero_ref.ds.engine",
        "zero_ref.ds.hf",
        "zero_ref.kernels",
        "zero_ref.launch",
        "zero_ref.ds.runtime.lr_schedules",
        "zero_ref.measure",
        "zero_ref.memory",
        "zero_ref.models",
        "zero_ref.offload",
        "zero_ref.offload.nvme",
        "zero_ref.optim",
        "zero_ref.parallel.groups",
        "zero_ref.parallel.moe",
        "zero_ref.parallel.pipeline",
        "zero_ref.parallel.ring_attention",
        "zero_ref.parallel.tensor",
        "zero_ref.parallel.topology",
        "zero_ref.parallel.ulysses",
        "zero_ref.precision",
        "zero_ref.profiling.profile",
        "zero_ref.profiling.torch_trace",
        "zero_ref.profiling.trial",
        "zero_ref.recipes.three_d",
        "zero_ref.stages",
        "zero_ref.stages.flat",
        "zero_ref.stages.zero3",
        "zero_ref.ds.utils.zero_to_fp32",
    }
)

_SLUG = re.compile(r"^[a-z0-9_]+$")
_MAX_SLUG = 32


@dataclass(frozen=True)
class Chapter:
    """One chapter of the course; checks its own fields when created."""

    number: int
    slug: str
    title_en: str
    title_zh: str
    goals: tuple[str, ...]
    seed: str
    modules: tuple[str, ...]

    def __post_init__(self) -> None:
        where = f"chapter {self.number!r}"
        if not (isinstance(self.number, int) and FIRST <= self.number <= LAST):
            raise ValueError(f"{where}: number must be from {FIRST} to {LAST}")
        if not _SLUG.match(self.slug) or len(self.slug) > _MAX_SLUG:
            raise ValueError(
                f"{where}: slug {self.slug!r} must match {_SLUG.pattern} "
                f"and be at most {_MAX_SLUG} characters"
            )
        for name in ("title_en", "title_zh", "seed"):
            value = getattr(self, name)
            if not value.strip():
                raise ValueError(f"{where}: {name} is empty")
            if "|" in value or "\n" in value:
                raise ValueError(f"{where}: {name} must not contain '|' or a newline")
        if not 3 <= len(self.goals) <= 5 or not all(g.strip() for g in self.goals):
            raise ValueError(f"{where}: needs 3 to 5 non-empty goals, has {len(self.goals)}")
        if not self.modules:
            raise ValueError(f"{where}: names no modules")
        unknown = sorted(set(self.modules) - ALLOWED_MODULES)
        if unknown:
            raise ValueError(f"{where}: unknown modules {unknown}")

    @property
    def notebook(self) -> str:
        """File name of the chapter's notebook inside ``notebooks/``."""
        return f"ch{self.number:02d}_{self.slug}.ipynb"


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(
        number=1,
        slug="course_map",
        title_en="Course map: DeepSpeed and ZeRO, DP / MP / PP basics, and do I need ZeRO?",
        title_zh="课程导入：DeepSpeed 与 ZeRO、分布式训练基础",
        goals=(
            "Explain what DeepSpeed is (an engine on top of PyTorch) and which redundancy "
            "of data-parallel training ZeRO removes",
            "Compute the 16Ψ bytes per GPU that mixed-precision Adam needs under plain "
            "data parallelism",
            "Distinguish data, tensor and pipeline parallelism by what each splits and "
            "which communication it needs",
            "Decide from model size and GPU memory whether a training job needs ZeRO",
            "Run a first all-reduce on two CPU ranks with zero_ref.launch",
        ),
        seed="Seed ch.1 §1.1–1.3 (course introduction)",
        modules=("zero_ref.memory", "zero_ref.launch", "zero_ref.comm", "sim"),
    ),
    Chapter(
        number=2,
        slug="training_memory",
        title_en="Where training memory goes: parameters, gradients, optimizer states "
        "and activations, measured",
        title_zh="训练显存去哪了：参数、梯度、优化器状态与激活值的实测",
        goals=(
            "Count the bytes per parameter of weights, gradients and Adam states in fp32 "
            "and in mixed precision (2 + 2 + 12 = 16)",
            "Measure the bytes each category holds on a rank and match them to the formula",
            "Estimate the activation memory of a transformer layer from batch size, "
            "sequence length and hidden size",
            "Compute the largest model whose Adam training states fit on one 80 GB GPU",
        ),
        seed="Seed ch.2–5 (memory model); the 16Ψ count of seed ch.1 §1.2 and ch.3 part 1",
        modules=(
            "zero_ref.memory",
            "zero_ref.measure",
            "zero_ref.models",
            "zero_ref.launch",
            "zero_ref.comm",
        ),
    ),
    Chapter(
        number=3,
        slug="zero1_optimizer_states",
        title_en="ZeRO-1: partitioning optimizer states",
        title_zh="ZeRO-1：优化器状态切分",
        goals=(
            "Partition Adam's optimizer states across N ranks so that each rank updates "
            "only its own shard",
            "Compute per-rank model-state memory under ZeRO-1, 4Ψ + 12Ψ/N, and correct the "
            "seed's claim that stage 1 reaches 16Ψ/N",
            "Verify that ZeRO-1 matches a single-process reference after several steps, "
            "including parameter counts not divisible by N",
            "Measure ZeRO-1's communication volume and show it equals data parallelism's 2Ψ",
        ),
        seed="Seed ch.2–5 (the three ZeRO stages); ZeRO-1 in seed ch.1 §1.2 and ch.3 part 1",
        modules=(
            "zero_ref.stages",
            "zero_ref.memory",
            "zero_ref.measure",
            "zero_ref.comm",
            "zero_ref.launch",
            "zero_ref.stages.flat",
            "zero_ref.models",
            "zero_ref.optim",
        ),
    ),
    Chapter(
        number=4,
        slug="zero2_gradients",
        title_en="ZeRO-2: partitioning gradients; reduce-scatter, buckets and overlap",
        title_zh="ZeRO-2：梯度切分；Reduce-Scatter、分桶与通信重叠",
        goals=(
            "Replace the gradient all-reduce with a reduce-scatter so that each rank keeps "
            "only its gradient shard",
            "Compute per-rank model-state memory under ZeRO-2, 2Ψ + 14Ψ/N",
            "Explain how gradient buckets let communication overlap the backward pass",
            "Measure how the bucket size changes the number of collectives and the peak "
            "gradient memory",
        ),
        seed="Seed ch.2–5 (the three ZeRO stages, communication analysis); ZeRO-2 in seed "
        "ch.3 part 1",
        modules=(
            "zero_ref.stages",
            "zero_ref.memory",
            "zero_ref.measure",
            "zero_ref.comm",
            "zero_ref.launch",
            "zero_ref.models",
            "zero_ref.optim",
        ),
    ),
    Chapter(
        number=5,
        slug="zero3_parameters",
        title_en="ZeRO-3: partitioning parameters; prefetch; communication volume 2Ψ vs 3Ψ",
        title_zh="ZeRO-3：参数切分；预取与通信量（2Ψ 对比 3Ψ）",
        goals=(
            "Gather each layer's parameters just before use and free them afterwards, in "
            "forward and backward",
            "Compute per-rank model-state memory under ZeRO-3, 16Ψ/N, plus the gathered "
            "working set",
            "Measure the 3Ψ communication volume per step against DDP's 2Ψ",
            "Explain how prefetching overlaps the next layer's all-gather with the current "
            "layer's compute",
        ),
        seed="Seed ch.2–5 (the three ZeRO stages, communication analysis); ZeRO-3 in seed "
        "ch.3 part 1",
        modules=(
            "zero_ref.stages",
            "zero_ref.memory",
            "zero_ref.measure",
            "zero_ref.comm",
            "zero_ref.launch",
            "zero_ref.models",
            "zero_ref.optim",
            "zero_ref.stages.zero3",
        ),
    ),
    Chapter(
        number=6,
        slug="zero_offload",
        title_en="ZeRO-Offload: the optimizer on the CPU; the PCIe budget",
        title_zh="ZeRO-Offload：把优化器卸载到 CPU；PCIe 带宽预算",
        goals=(
            "Move fp32 master weights and Adam states to CPU memory and run the update there",
            "Compute the PCIe traffic of one step (fp16 gradients to the CPU, fp16 "
            "parameters back) and its time at a given bandwidth",
            "Measure the CPU Adam step and judge when it stays hidden behind GPU compute",
            "Explain with numbers why offloading does not always speed training up",
        ),
        seed="Seed ch.6–8 (ZeRO-Offload); seed ch.3 part 2",
        modules=(
            "zero_ref.offload",
            "zero_ref.memory",
            "zero_ref.launch",
            "sim",
            "zero_ref.models",
            "zero_ref.optim",
            "zero_ref.stages",
        ),
    ),
    Chapter(
        number=7,
        slug="zero_infinity",
        title_en="ZeRO-Infinity: the NVMe tier; bandwidth-aware prefetch",
        title_zh="ZeRO-Infinity：NVMe 存储层与带宽感知预取",
        goals=(
            "Place parameters, gradients and optimizer states across GPU, CPU and NVMe",
            "Compute the NVMe bandwidth a training step needs for a given model and batch",
            "Simulate when bandwidth-aware prefetching hides the NVMe reads",
            "Compare the largest trainable model on one node under ZeRO-3, ZeRO-Offload "
            "and ZeRO-Infinity",
        ),
        seed="Seed ch.6–8 (ZeRO-Infinity); seed ch.3 part 2",
        modules=(
            "zero_ref.offload",
            "zero_ref.memory",
            "zero_ref.launch",
            "zero_ref.models",
            "zero_ref.offload.nvme",
            "zero_ref.optim",
            "zero_ref.stages",
        ),
    ),
    Chapter(
        number=8,
        slug="core_concepts",
        title_en="The four ideas together: ZeRO, Offload, Infinity and 3D parallelism — "
        "which when",
        title_zh="DeepSpeed 核心概念：ZeRO、Offload、Infinity 与 3D 并行如何取舍",
        goals=(
            "Explain ZeRO, ZeRO-Offload, ZeRO-Infinity and 3D parallelism as answers to "
            "four different memory limits",
            "Check the seed's '4×' and '8×' savings of ZeRO-1 and ZeRO-2 against the exact "
            "formulas for a given N",
            "Choose among ZeRO stages, offload and 3D parallelism for a model and cluster, "
            "and justify the choice with the simulator",
            "Read the seed's combined ZeRO-2, CPU-offload and 3D config and say what each "
            "part does",
        ),
        seed="Seed ch.3 parts 1–5 (DeepSpeed core concepts: ZeRO, Offload, Infinity, 3D)",
        modules=("sim", "zero_ref.memory", "zero_ref.config"),
    ),
    Chapter(
        number=9,
        slug="config_file",
        title_en="The DeepSpeed config file, key by key",
        title_zh="DeepSpeed 配置文件逐项解读",
        goals=(
            "Explain each config key in use: batch sizes, precision, zero_optimization, "
            "offload and gradient clipping",
            "Verify the identity train_batch_size = micro-batch per GPU × gradient "
            "accumulation steps × data-parallel size",
            "Validate the seed's example configs and explain each error the validator reports",
            "Choose the ZeRO stage and offload whose model states fit a GPU memory budget with "
            "the least traffic per step",
        ),
        seed="Seed ch.9–12 (the config file, item by item); the example configs of seed "
        "ch.1 §1.2 and ch.3 part 4",
        modules=(
            "zero_ref.config",
            "zero_ref.config.schema",
            "zero_ref.ds.engine",
            "zero_ref.ds.runtime.lr_schedules",
            "zero_ref.precision",
        ),
    ),
    Chapter(
        number=10,
        slug="porting_a_script",
        title_en="Porting a PyTorch script in three steps: initialize, backward, step",
        title_zh="三步迁移 PyTorch 训练脚本：initialize / backward / step",
        goals=(
            "Port a plain PyTorch training loop to the engine: write a config, call "
            "initialize, use engine.backward and engine.step",
            "Verify that the ported script reproduces the original losses on one rank",
            "Port a script with a dataloader, a schedule and a resumed run, and run it on "
            "several ranks on zero_ref and on DeepSpeed",
            "Explain what engine.backward and engine.step do beyond loss.backward and "
            "optimizer.step",
        ),
        seed="Seed ch.1 §1.2 (the three-step port) and ch.9–12 (deployment)",
        modules=("zero_ref.ds.engine", "zero_ref.config", "zero_ref.models", "zero_ref.launch"),
    ),
    Chapter(
        number=11,
        slug="huggingface",
        title_en="HuggingFace Transformers integration",
        title_zh="与 HuggingFace Transformers 集成",
        goals=(
            "Train a HuggingFace Transformers model through zero_ref.initialize with a "
            "DeepSpeed config",
            "Explain how the training arguments fill the config's batch-size and "
            "accumulation keys",
            "Compare per-rank memory of the same model under ZeRO stages 0 to 3",
        ),
        seed="Seed ch.9–12 (HuggingFace Transformers integration)",
        modules=(
            "zero_ref.ds.engine",
            "zero_ref.config",
            "zero_ref.launch",
            "zero_ref.comm",
            "zero_ref.ds.hf",
            "zero_ref.memory",
            "zero_ref.stages.zero3",
        ),
    ),
    Chapter(
        number=12,
        slug="troubleshooting",
        title_en="Troubleshooting: out of memory, hangs and timeouts, divergence",
        title_zh="常见错误排查：OOM、通信挂起与超时、训练不收敛",
        goals=(
            "Diagnose an out-of-memory error by attributing memory to parameters, gradients, "
            "optimizer states and activations",
            "Reproduce a hang from mismatched collectives and read the timeout report that "
            "names the rank",
            "Detect divergence from fp16 overflow and a collapsing loss scale in the "
            "training log",
            "Fix a config from the error message that names the offending key",
        ),
        seed="Seed ch.9–12 (troubleshooting); the troubleshooting skill listed in seed ch.1 §1.1",
        modules=(
            "zero_ref.diagnostics",
            "zero_ref.ds.engine",
            "zero_ref.config",
            "zero_ref.memory",
            "zero_ref.launch",
            "sim",
            "zero_ref.comm",
            "zero_ref.measure",
            "zero_ref.models",
            "zero_ref.optim",
            "zero_ref.precision",
            "zero_ref.stages",
        ),
    ),
    Chapter(
        number=13,
        slug="mixed_precision",
        title_en="Mixed precision: fp16 / bf16, master weights, dynamic loss scaling",
        title_zh="混合精度训练：FP16 / BF16、主权重与动态损失缩放",
        goals=(
            "Explain the ranges of fp16 and bf16 and why fp32 master weights are kept",
            "Implement dynamic loss scaling: skip the step and lower the scale on overflow, "
            "raise it after a window of clean steps",
            "Measure the loss gap between fp32, fp16 and bf16 training of the same model",
            "Compute the bytes per parameter of each precision recipe",
        ),
        seed="Seed ch.13–20 (mixed-precision training)",
        modules=(
            "zero_ref.precision",
            "zero_ref.memory",
            "zero_ref.models",
            "zero_ref.launch",
            "zero_ref.measure",
            "zero_ref.optim",
            "zero_ref.stages",
        ),
    ),
    Chapter(
        number=14,
        slug="fused_adam_kernel",
        title_en="The fused Adam kernel: CUDA extension vs Numba vs PyTorch, against the "
        "roofline",
        title_zh="融合 Adam 内核：CUDA 扩展、Numba 与 PyTorch 对比及 Roofline 分析",
        goals=(
            "Write Adam as one fused pass over parameters, gradients and optimizer states",
            "Verify that the CUDA, Numba and PyTorch implementations agree on identical "
            "inputs to a stated tolerance",
            "Compute the bytes moved per parameter in one Adam step and the time bound "
            "set by memory bandwidth",
            "Measure the achieved bandwidth of each implementation and place it on a roofline",
        ),
        seed="Seed ch.6–8 (the CPU Adam behind ZeRO-Offload); kernel optimization in seed "
        "ch.1 §1.2",
        modules=("zero_ref.kernels", "zero_ref.optim"),
    ),
    Chapter(
        number=15,
        slug="activation_checkpointing",
        title_en="Activation checkpointing, partitioned and on the CPU",
        title_zh="激活检查点（含分片与 CPU 检查点）",
        goals=(
            "Recompute activations in the backward pass instead of storing them, and verify "
            "that gradients are unchanged",
            "Measure activation memory with and without checkpointing and compare it with "
            "the formula",
            "Compute the cost of recomputation: one extra forward pass per step",
            "Explain partitioned and CPU activation checkpointing under tensor parallelism",
        ),
        seed="Seed ch.13–20 (activation checkpointing)",
        modules=(
            "zero_ref.ds.checkpointing",
            "zero_ref.memory",
            "zero_ref.measure",
            "zero_ref.models",
            "sim",
            "zero_ref.comm",
            "zero_ref.launch",
            "zero_ref.parallel.groups",
            "zero_ref.parallel.tensor",
            "zero_ref.parallel.topology",
        ),
    ),
    Chapter(
        number=16,
        slug="gradient_accumulation",
        title_en="Gradient accumulation and batch-size arithmetic",
        title_zh="梯度累积与批大小换算",
        goals=(
            "Accumulate gradients over micro-batches and verify the result equals one large "
            "batch",
            "Compute the global batch from micro-batch size, accumulation steps and "
            "data-parallel size, and check the seed's examples",
            "Explain why gradients are reduced only after the last micro-batch",
            "Measure the communication saved by reducing once per accumulation window",
        ),
        seed="Seed ch.13–20 (gradient accumulation); the batch arithmetic of seed ch.1 "
        "§1.2–1.3",
        modules=(
            "zero_ref.comm",
            "zero_ref.launch",
            "sim",
            "zero_ref.config.batch",
            "zero_ref.models",
            "zero_ref.optim",
            "zero_ref.stages",
        ),
    ),
    Chapter(
        number=17,
        slug="collectives",
        title_en="Collectives: ring and tree algorithms, the alpha-beta cost model",
        title_zh="集合通信：Ring / Tree 算法与 α-β 代价模型",
        goals=(
            "Implement ring all-reduce as reduce-scatter plus all-gather and count the bytes "
            "each rank sends: 2(N − 1)/N times the message size",
            "Compute collective times with the alpha-beta model for ring and tree algorithms",
            "Measure bytes per collective with the counting comm layer and match them to theory",
            "Test with the cost model the seed's figure that data-parallel communication can "
            "exceed 30% of step time",
        ),
        seed="Seed ch.2–5 (communication analysis) and ch.13–20 (communication "
        "optimization); the data-parallel misconception at the end of seed ch.1",
        modules=(
            "zero_ref.comm",
            "zero_ref.launch",
            "sim",
            "zero_ref.collective_algorithms",
            "zero_ref.profiling.profile",
        ),
    ),
    Chapter(
        number=18,
        slug="comm_optimization",
        title_en="Communication optimization: bucketing, overlap, gradient compression",
        title_zh="通信优化：分桶、计算通信重叠与梯度压缩",
        goals=(
            "Measure how bucketing gradients cuts the number of collectives and their "
            "latency cost",
            "Overlap gradient reduction with backward compute and show the effect on a timeline",
            "Implement gradient compression with error feedback and measure the bytes saved",
            "Compare the loss curves of compressed and uncompressed training",
        ),
        seed="Seed ch.13–20 (communication optimization: gradient compression)",
        modules=(
            "zero_ref.compression",
            "zero_ref.comm",
            "zero_ref.stages",
            "zero_ref.launch",
            "sim",
            "zero_ref.models",
            "zero_ref.optim",
        ),
    ),
    Chapter(
        number=19,
        slug="tensor_parallelism",
        title_en="Tensor parallelism (Megatron style) and sequence parallelism",
        title_zh="张量并行（Megatron 风格）与序列并行",
        goals=(
            "Split linear layers by columns and by rows and verify the outputs equal the "
            "unsplit layer",
            "Count the all-reduces per transformer layer in forward and backward",
            "Correct the seed's statement that tensor parallelism relies on all-to-all: "
            "it needs all-reduce, or all-gather and reduce-scatter",
            "Add sequence parallelism and measure the activation memory it saves",
        ),
        seed="Seed ch.1 §1.3 (model parallelism) and ch.3 part 3 (3D parallelism)",
        modules=(
            "zero_ref.parallel.topology",
            "zero_ref.comm",
            "zero_ref.launch",
            "sim",
            "zero_ref.measure",
            "zero_ref.memory",
            "zero_ref.models",
            "zero_ref.parallel.tensor",
        ),
    ),
    Chapter(
        number=20,
        slug="pipeline_parallelism",
        title_en="Pipeline parallelism: GPipe, 1F1B and interleaved schedules; bubbles",
        title_zh="流水线并行：GPipe、1F1B 与交错调度；流水线气泡",
        goals=(
            "Implement GPipe and 1F1B schedules as explicit warm-up, steady-state and "
            "cool-down phases",
            "Compute the bubble fraction (s − 1)/(m + s − 1) for s stages and m micro-batches, "
            "and show why the seed's (m − 1)/(m + s − 1) is wrong",
            "Verify with the simulator how interleaved stages shrink the bubble",
            "Compare the peak activation memory of GPipe and 1F1B",
        ),
        seed="Seed ch.1 §1.3 (pipeline parallelism and its bubble) and ch.3 part 3",
        modules=(
            "zero_ref.launch",
            "sim",
            "zero_ref.comm",
            "zero_ref.models",
            "zero_ref.parallel.pipeline",
        ),
    ),
    Chapter(
        number=21,
        slug="3d_parallelism",
        title_en="3D parallelism: topology and process groups, with ZeRO",
        title_zh="3D 并行：拓扑、进程组与 ZeRO 的结合",
        goals=(
            "Build the TP × PP × DP rank grid as a pure function and check that every rank "
            "sits in exactly one group per axis",
            "Explain why tensor parallelism stays inside a node and pipeline stages span nodes",
            "Apply ZeRO along the data-parallel axis and compute the per-rank memory",
            "Verify that a 3D run matches a single-process reference on the same data",
        ),
        seed="Seed ch.1 §1.3 (choosing a parallel strategy) and ch.3 part 3 (3D parallelism)",
        modules=(
            "zero_ref.parallel.topology",
            "zero_ref.launch",
            "zero_ref.comm",
            "zero_ref.measure",
            "zero_ref.memory",
            "zero_ref.models",
            "zero_ref.optim",
            "zero_ref.parallel.groups",
            "zero_ref.parallel.pipeline",
            "zero_ref.recipes.three_d",
        ),
    ),
    Chapter(
        number=22,
        slug="lab_small_gpt",
        title_en="Lab: a small GPT end to end with 3D parallelism and ZeRO on CPU ranks",
        title_zh="实战：在 CPU 进程上用 3D 并行 + ZeRO 端到端训练小型 GPT",
        goals=(
            "Train a small GPT with tensor, pipeline and data parallelism plus ZeRO on "
            "CPU ranks",
            "Verify that its losses match a single-process run to a stated tolerance",
            "Measure per-rank memory and compare it with the formula and the simulator; measure each axis's\n"
            "  communication bytes and compare them with your own prediction",
            "Save a checkpoint, resume, and confirm that training continues identically",
        ),
        seed="Seed ch.21–30 (case studies, from setup to tuning)",
        modules=(
            "zero_ref.parallel.topology",
            "zero_ref.launch",
            "sim",
            "zero_ref.config.batch",
            "zero_ref.memory",
            "zero_ref.recipes.three_d",
        ),
    ),
    Chapter(
        number=23,
        slug="case_gpt3_175b",
        title_en="Case study: GPT-3 175B — memory and throughput plan vs published numbers",
        title_zh="案例：GPT-3 175B——显存与吞吐规划对照公开数据",
        goals=(
            "Compute per-GPU memory of GPT-3 175B's model states and activations for a "
            "chosen TP × PP × DP plan",
            "Compute the training FLOPs (about 6 × parameters × tokens) and the time for a "
            "given token budget",
            "Estimate step time and TFLOP/s per GPU with the simulator and compare them "
            "with published numbers",
            "Explain which effect limits the plan's efficiency: bubble, communication or memory",
        ),
        seed="Seed ch.21–30 (case study: 175B)",
        modules=("sim", "zero_ref.memory"),
    ),
    Chapter(
        number=24,
        slug="case_llama_65b",
        title_en="Case study: LLaMA-65B — the seed's plan, checked and corrected",
        title_zh="案例：LLaMA-65B——核验并修正原课程的方案",
        goals=(
            "Recompute the seed's 65B memory estimate and add the gradients it leaves out",
            "Recheck the seed's per-GPU figures for TP = 8, PP = 8, DP = 4 with ZeRO-1 and "
            "locate each arithmetic error",
            "Check the seed's batch arithmetic (16 micro-batches, accumulation 8, global "
            "batch 2048) against the batch identity",
            "Simulate the corrected plan and report peak memory per GPU and the bubble "
            "fraction",
        ),
        seed="Seed ch.1 §1.3 (the 65B case study) and ch.21–30 (case study: LLaMA-65B)",
        modules=("sim", "zero_ref.memory"),
    ),
    Chapter(
        number=25,
        slug="case_moe",
        title_en="Case study: Mixture of Experts — expert parallelism and all-to-all",
        title_zh="案例：MoE——专家并行与 All-to-All 通信",
        goals=(
            "Route tokens to experts with a top-k gate and dispatch them with all-to-all",
            "Verify that expert-parallel outputs and gradients match a single-process "
            "reference",
            "Compute the parameters and FLOPs per token of an MoE layer against its dense "
            "counterpart",
            "Measure all-to-all bytes per rank and explain capacity factor and dropped tokens",
        ),
        seed="Seed ch.21–30 (case study: MoE)",
        modules=(
            "zero_ref.comm",
            "zero_ref.launch",
            "zero_ref.models",
            "zero_ref.parallel.groups",
            "zero_ref.parallel.moe",
            "zero_ref.parallel.topology",
        ),
    ),
    Chapter(
        number=26,
        slug="long_sequences",
        title_en="Long sequences: activation memory and sequence parallelism",
        title_zh="长序列训练：激活显存与序列并行",
        goals=(
            "Compute activation memory per layer as a function of sequence length, "
            "including the attention scores' quadratic term",
            "Measure how sequence parallelism and activation checkpointing reduce "
            "activation memory",
            "Find with the simulator the longest sequence that fits a given GPU and plan",
            "Run FlashAttention-style blocks, ring attention and DeepSpeed-Ulysses on real ranks, "
            "equal to single-device attention, and price their memory and traffic at scale",
        ),
        seed="Seed ch.13–20 (activation checkpointing), carried to long sequences; not a "
        "topic of its own in the seed's outline",
        modules=(
            "zero_ref.memory",
            "zero_ref.measure",
            "sim",
            "zero_ref.launch",
            "zero_ref.models",
            "zero_ref.parallel.tensor",
            "zero_ref.parallel.ring_attention",
            "zero_ref.parallel.ulysses",
        ),
    ),
    Chapter(
        number=27,
        slug="checkpoints_fault_tolerance",
        title_en="Checkpoints and fault tolerance: sharded save, resume, elastic restart",
        title_zh="检查点与容错：分片保存、断点续训与弹性重启",
        goals=(
            "Save a sharded checkpoint in which each rank writes its own partition, and "
            "load it back",
            "Resume training and verify that the losses continue exactly as without the "
            "interruption",
            "Restart from the same checkpoint on a different number of ranks and verify "
            "that the model is unchanged",
            "Explain what a checkpoint must hold: parameters, optimizer states, loss scale, random state and data position\n"
            "  (the runs below measure what a resume without the optimizer states does; the loss scale, the random state\n"
            "  and the data position are explained, not tested by leaving them out)",
        ),
        seed="Seed ch.9–12 (deployment) and ch.21–30 (case studies); not a topic of its "
        "own in the seed's outline",
        modules=(
            "zero_ref.checkpoint",
            "zero_ref.launch",
            "zero_ref.comm",
            "zero_ref.stages.flat",
            "zero_ref.models",
            "zero_ref.ds.utils.zero_to_fp32",
        ),
    ),
    Chapter(
        number=28,
        slug="profiling_tuning",
        title_en="Profiling and tuning: MFU, traces, simulated vs measured",
        title_zh="性能剖析与调优：MFU、Trace 与模拟/实测对比",
        goals=(
            "Compute model FLOPs utilization (MFU) from step time, model size and tokens "
            "per step",
            "Record a torch.profiler trace and open it beside the simulator's Chrome trace",
            "Compare simulated and measured step times and explain the gap",
            "Locate the bottleneck of a step: compute, communication, memory or pipeline bubble",
        ),
        seed="Seed ch.21–30 (performance tuning in the case studies)",
        modules=("sim", "zero_ref.profiling.profile", "zero_ref.profiling.torch_trace"),
    ),
    Chapter(
        number=29,
        slug="auto_tuning",
        title_en="Auto-tuning a configuration with the simulator",
        title_zh="用模拟器自动调优训练配置",
        goals=(
            "Enumerate TP × PP × DP × ZeRO-stage plans for a model and cluster and discard "
            "those that do not fit in memory",
            "Rank the remaining plans by simulated throughput",
            "Explain the trade-off the best plan makes and check it against a small real run",
        ),
        seed="Seed ch.1 §1.3 (choosing a parallel strategy) and ch.21–30 (tuning)",
        modules=(
            "sim",
            "zero_ref.memory",
            "zero_ref.launch",
            "zero_ref.measure",
            "zero_ref.models",
            "zero_ref.stages",
        ),
    ),
    Chapter(
        number=30,
        slug="capstone",
        title_en="Capstone: plan, run and defend a full configuration",
        title_zh="综合项目：规划、运行并论证一套完整的训练配置",
        goals=(
            "Plan a full configuration for a given model, cluster and token budget",
            "Run the plan at small scale and compare measured memory and communication "
            "with the predictions",
            "Defend each choice (ZeRO stage, offload, TP × PP × DP, precision, "
            "checkpointing) with numbers",
        ),
        seed="Seed ch.1 §1.1 (the four core skills) and ch.21–30 (from setup to tuning)",
        modules=(
            "sim",
            "zero_ref.config",
            "zero_ref.memory",
            "zero_ref.profiling.profile",
            "zero_ref.profiling.trial",
        ),
    ),
)

_BY_SLUG: dict[str, Chapter] = {ch.slug: ch for ch in CHAPTERS}

# The table above must stay complete, ordered and free of duplicate slugs.
assert [ch.number for ch in CHAPTERS] == list(range(FIRST, LAST + 1)), "chapters out of order"
assert len(_BY_SLUG) == len(CHAPTERS), "duplicate chapter slug"


def chapter(n: int) -> Chapter:
    """The chapter numbered ``n`` (1 to 30)."""
    if isinstance(n, bool) or not isinstance(n, int) or not FIRST <= n <= LAST:
        raise ValueError(f"chapter number must be an integer from {FIRST} to {LAST}, got {n!r}")
    return CHAPTERS[n - FIRST]


def by_slug(slug: str) -> Chapter:
    """The chapter whose slug is ``slug``, e.g. ``by_slug("zero_offload")``."""
    try:
        return _BY_SLUG[slug]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(slug), list(_BY_SLUG), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"no chapter has the slug {slug!r}{hint}") from None


def title_markdown(ch: Chapter) -> str:
    """The first markdown cell of the chapter's notebook (no trailing newline)."""
    lines = [
        f"# Chapter {ch.number} · {ch.title_en}",
        f"## {ch.title_zh}",
        "",
        f"*Mirrors: {ch.seed}*",
        "",
        "**Learning goals**",
        *(f"- {goal}" for goal in ch.goals),
    ]
    return "\n".join(lines)


def readme_table(lang: str = "en") -> str:
    """The README's chapter table: one Markdown row per chapter (no trailing newline). The Chinese title links
    to the chapter's Chinese edition (notebooks/zh/) where it has been built. ``lang="zh"``: README.zh.md's,
    Chinese title first, linking the Chinese notebook."""
    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    if lang == "zh":
        rows = ["| # | 章节 | English | 笔记本 |", "|---|---|---|---|"]
        for ch in CHAPTERS:
            built = (notebooks / "zh" / ch.notebook).exists()
            path = f"notebooks/zh/{ch.notebook}" if built else f"notebooks/{ch.notebook}"
            rows.append(f"| {ch.number} | {ch.title_zh} | {ch.title_en} | [{ch.notebook.removesuffix('.ipynb')}]({path}) |")
        return "\n".join(rows)
    rows = ["| # | Chapter | 章节 | Notebook |", "|---|---|---|---|"]
    for ch in CHAPTERS:
        stem = ch.notebook.removesuffix(".ipynb")
        link = f"[{stem}](notebooks/{ch.notebook})"
        zh = f"[{ch.title_zh}](notebooks/zh/{ch.notebook})" if (notebooks / "zh" / ch.notebook).exists() else ch.title_zh
        rows.append(f"| {ch.number} | {ch.title_en} | {zh} | {link} |")
    return "\n".join(rows)


def main() -> None:
    """Print the README chapter table (``python -m course.syllabus``)."""
    print(readme_table())


if __name__ == "__main__":
    main()
