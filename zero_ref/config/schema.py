"""The keys of a DeepSpeed config, declared once: type, DeepSpeed 0.19.8's code default, range, meaning,
and what zero_ref does with each (pure Python; read by zero_ref.config).

Each section is a frozen dataclass whose fields are the JSON keys. ``key(default, doc, ...)`` records:
``ge``/``gt``/``le`` (ranges, as DeepSpeed's pydantic ``Field``), ``choices``; ``only`` + ``why``: the
values zero_ref implements (any other value is an error saying why); ``noop``: accepted but changes
nothing in zero_ref (reported in ``Config.notes``); ``docs``: DeepSpeed's *documented* default where it
differs from the code. A type ``path`` is a filesystem path, ``betas`` Adam's pair of betas.

Class attributes: ``DEEPSPEED_ONLY`` — keys DeepSpeed has and zero_ref does not implement (an error
unless they are off); ``REMOVED`` — keys DeepSpeed 0.19 itself rejects; ``HINTS`` — frequent wrong
names, with the right one. ``defaults_table()`` / ``format_defaults()`` list every key (chapter 9).
"""
from __future__ import annotations

import gettext
import json
import sys
from dataclasses import asdict, dataclass, field, fields, is_dataclass

path = str  # annotation kinds (the annotations stay strings: from __future__ import annotations)
betas = tuple

ADAM_TYPES = ("adam", "adamw")
# DeepSpeed's own optimizers and the torch.optim classes it would look up by name.
DEEPSPEED_OPTIMIZERS = ("adagrad", "lamb", "lion", "muon", "muadam", "muadamw", "musgd", "onebitadam",
                        "zerooneadam", "onebitlamb", "sgd", "rmsprop", "adadelta", "adamax", "nadam", "radam",
                        "asgd", "lbfgs", "rprop", "sparseadam")


def key(default=None, doc: str = "", *, factory=None, **meta):
    meta["doc"] = doc
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# ---------------------------------------------------------------- precision

@dataclass(frozen=True)
class FP16Config:
    enabled: bool = key(False, "train in fp16 with fp32 master weights and loss scaling")
    auto_cast: bool = key(False, "cast the module's inputs to fp16", only=(False,),
                          why="the engine passes inputs through unchanged")
    loss_scale: float = key(0.0, "0 = dynamic loss scaling; any other value is a static scale", ge=0)
    initial_scale_power: int = key(16, "the dynamic scale starts at 2**initial_scale_power", ge=0)
    loss_scale_window: int = key(1000, "clean steps before the dynamic scale doubles", ge=1)
    hysteresis: int = key(2, "overflows in a row tolerated before the scale halves", ge=1)
    consecutive_hysteresis: bool = key(False, "refill the hysteresis after every clean step")
    min_loss_scale: int = key(1, "the dynamic scale never falls below this", ge=1)
    fp16_master_weights_and_grads: bool = key(False, "keep master weights in fp16 (DeepSpeedCPUAdam only)",
                                              only=(False,), why="master weights are always fp32")


@dataclass(frozen=True)
class BF16Config:
    enabled: bool = key(False, "train in bf16 with fp32 master weights (no loss scaling)")
    immediate_grad_update: bool = key(False, "apply gradients to the fp32 copy during backward",
                                      noop="gradients are applied at the optimizer step",
                                      code_note="constants.py says True; the pydantic model that is used says False")
    check_grad_overflow: bool = key(True, "skip the step when a gradient is inf/nan", only=(True,),
                                    why="the stages always check for inf/nan and skip the step")
    # DeepSpeed 0.19.8: runtime/base_optimizer.py, _configure_master_weights (the dtype, and bf16_optimizer_states
    # needing bf16_master_weights_and_grads); runtime/config.py, _do_error_check (ZeRO 1-3 only);
    # runtime/zero/stage_1_and_2.py, _enforce_cpu_offload (ZeRO-Offload + DeepSpeedCPUAdam unless the moments are bf16)
    bf16_master_weights_and_grads: bool = key(
        False, "keep the master weights and gradient partitions in bf16 (ZeRO 1-3)", only=(False,),
        why="DeepSpeed's ZeRO 1-3 optimizer then keeps its master partition and gradients in bf16, no fp32 copy, "
            "on the host with DeepSpeedCPUAdam unless bf16_optimizer_states; zero_ref keeps fp32 master weights and "
            "moments. Nearest: remove it (2 + 14/N bytes per parameter at ZeRO-2; DeepSpeed's all-bf16 states: "
            "2 + 8/N) and set zero_optimization.offload_optimizer {\"device\": \"cpu\"} to hold them on the host")
    bf16_optimizer_states: bool = key(
        False, "keep Adam's moments in bf16 (needs bf16_master_weights_and_grads)", only=(False,),
        why="DeepSpeed then keeps Adam's moments in bf16 (with bf16_master_weights_and_grads only); zero_ref's are "
            "fp32. Nearest: remove both keys and set zero_optimization.offload_optimizer {\"device\": \"cpu\"} "
            "to hold the fp32 master and moments on the host")


# ---------------------------------------------------------------- offload and NVMe

@dataclass(frozen=True)
class OffloadOptimizerConfig:
    """``zero_optimization.offload_optimizer`` (ZeRO-Offload; ZeRO-Infinity with ``device`` nvme)."""

    device: str = key("none", "where the optimizer partition lives: none, cpu or nvme",
                      choices=("none", "cpu", "nvme"), docs="cpu")
    nvme_path: path | None = key(None, "folder for the swap files (device nvme)", docs="/local_nvme")
    buffer_count: int = key(4, "swap buffers for the NVMe step (at least Adam's 4 states)", ge=0)
    pin_memory: bool = key(True, "page-locked host buffers (CUDA only; means nothing on a CPU run)")
    pipeline_read: bool = key(False, "read the next NVMe sub-group while this one steps")
    pipeline_write: bool = key(False, "write the previous NVMe sub-group while this one steps")
    fast_init: bool = key(False, "faster NVMe initialisation", noop="initialisation writes each state once anyway")
    ratio: float = key(1.0, "fraction of the optimizer stepped on the host", ge=0, le=1)
    super_offload: bool = key(False, "Superchip offload (stage 3)")
    cpuadam_cores_perc: float = key(0.8, "share of the cores CPU Adam uses with super_offload", ge=0, le=1,
                                    noop="the rank's torch threads step Adam")


@dataclass(frozen=True)
class OffloadParamConfig:
    """``zero_optimization.offload_param`` (stage 3 only)."""

    device: str = key("none", "where parameter partitions live between uses: none, cpu or nvme",
                      choices=("none", "cpu", "nvme"), docs="cpu")
    nvme_path: path | None = key(None, "folder for the swap files (device nvme)", docs="/local_nvme")
    buffer_count: int = key(5, "buffers for NVMe parameter reads", ge=0,
                            noop="each read gets its own buffer")
    buffer_size: int = key(int(1e8), "elements per NVMe parameter buffer (the largest unit must fit)", ge=0)
    max_in_cpu: int = key(int(1e9), "parameter elements kept in host memory with NVMe", ge=0,
                          noop="with nvme every partition lives in its file")
    pin_memory: bool = key(True, "page-locked host buffers (CUDA only)")


@dataclass(frozen=True)
class AioConfig:
    """The top-level ``aio`` section (asynchronous I/O for the NVMe tier)."""

    block_size: int = key(1048576, "bytes per I/O request", ge=1)
    queue_depth: int = key(8, "requests in flight per thread", ge=1)
    intra_op_parallelism: int = key(1, "threads that split each read or write", ge=1)
    single_submit: bool = key(False, "submit requests one by one")
    overlap_events: bool = key(True, "submit without waiting for earlier requests")
    use_gds: bool = key(False, "GPUDirect Storage", only=(False,), why="GPUDirect Storage is not implemented")

    HINTS = {"thread_count": "DeepSpeed's docs call it thread_count, but its code reads intra_op_parallelism"}


# ---------------------------------------------------------------- ZeRO

@dataclass(frozen=True)
class ZeroConfig:
    stage: int = key(0, "0 data parallel, 1 optimizer states, 2 + gradients, 3 + parameters partitioned",
                     choices=(0, 1, 2, 3))
    contiguous_gradients: bool = key(True, "copy gradients into a contiguous buffer as they are produced",
                                     only=(True,), why="gradients always go to flat contiguous buffers")
    reduce_scatter: bool = key(True, "reduce gradients with reduce-scatter rather than all-reduce", only=(True,),
                               why="stages 1-3 always reduce-scatter (stage 0 all-reduces)")
    reduce_bucket_size: int = key(int(5e8), "elements per gradient bucket (stages 0-2; ZeRO-3 reduces per unit)",
                                  gt=0)
    use_multi_rank_bucket_allreduce: bool = key(True, "merge buckets of different ranks into one all-reduce",
                                                noop="zero_ref issues one collective per bucket")
    allgather_partitions: bool = key(True, "all-gather updated partitions (else a series of broadcasts)",
                                     only=(True,), why="updated partitions are always all-gathered")
    allgather_bucket_size: int = key(int(5e8), "elements per parameter all-gather", ge=0,
                                     noop="stages 1-2 all-gather per gradient bucket, stage 3 per unit")
    overlap_comm: bool | None = key(None, "overlap gradient reduction with backward; None: on for stage 3 only",
                                    docs=False)
    compute_grad_norm: bool = key(True, "compute the global gradient norm at each step", only=(True,),
                                  why="the norm is always computed (clipping and overflow need it)")
    load_from_fp32_weights: bool = key(True, "restore fp32 master weights from the checkpoint's fp32 copy",
                                       only=(True,), why="the fp32 masters are always restored")
    elastic_checkpoint: bool = key(False, "legacy elastic checkpoints", only=(False,), why="deprecated in DeepSpeed")
    offload_param: OffloadParamConfig | None = key(None, "parameter offload (stage 3)")
    offload_optimizer: OffloadOptimizerConfig | None = key(None, "optimizer offload (stages 1-3)")
    sub_group_size: int = key(int(1e9), "elements per optimizer sub-group (NVMe swaps one at a time)", ge=1)
    stage3_prefetch_bucket_size: int = key(int(5e7), "elements of parameters fetched ahead of use", ge=0,
                                           docs=int(5e8))
    stage3_param_persistence_threshold: int = key(int(1e5), "units this small stay gathered", ge=0)
    stage3_model_persistence_threshold: int = key(sys.maxsize, "cap on the persistent elements in all", ge=0,
                                                  noop="persistence is per unit, without a total cap")
    stage3_max_live_parameters: int = key(int(1e9), "gathered elements kept at most", ge=0)
    stage3_max_reuse_distance: int = key(int(1e9), "keep a parameter gathered if reused within this many", ge=0)
    stage3_gather_16bit_weights_on_model_save: bool = key(False, "gather the 16-bit weights in save_16bit_model")
    stage3_module_granularity_threshold: int = key(0, "fetch fine-grained modules as one unit", ge=0,
                                                   noop="units are per module (or per unit_modules subtree)")
    stage3_use_all_reduce_for_fetch_params: bool = key(False, "fetch parameters with all-reduce", only=(False,),
                                                       why="parameters are fetched with all-gather")
    stage3_allgather_sequential: bool = key(False, "all-gather parameters one by one, unbucketed", only=(False,),
                                            why="a unit is gathered in one collective")
    ignore_unused_parameters: bool = key(True, "tolerate parameters that get no gradient", only=(True,),
                                         why="an unused parameter reduces zeros")
    legacy_stage1: bool = key(False, "the old ZeRO-1", only=(False,), why="one ZeRO-1")
    round_robin_gradients: bool = key(False, "spread gradient copies to the host over ranks", only=(False,),
                                      why="not implemented")
    parameter_alignment: bool = key(False, "16-byte-align each parameter in the flat buffers", only=(False,),
                                    why="parameters are packed end to end")
    # ZeRO++ (DeepSpeed 0.19.8: runtime/zero/config.py; zero_ref.stages.zero3.zeropp). Below stage 3 DeepSpeed reads
    # them and does nothing with them (only its stage-3 optimizer takes them): a note here.
    zero_hpz_partition_size: int = key(1, "ZeRO++ hpZ: a secondary parameter partition over this many consecutive "
                                          "ranks (a node); 0 or 1: off", ge=0)
    zero_quantized_weights: bool = key(False, "ZeRO++ qwZ: all-gather ZeRO-3 weights as int8 blocks")
    zero_quantized_nontrainable_weights: bool = key(False, "ZeRO++: all-gather frozen weights as int8 blocks",
                                                    zero_ref="used for the gathers; the partitions stay full precision "
                                                             "(DeepSpeed stores them in int8)")
    zero_quantized_gradients: bool = key(False, "ZeRO++ qgZ: reduce gradients by a hierarchical int4 all-to-all")
    memory_efficient_linear: bool = key(True, "ZeRO-3's linear that saves no gathered weight",
                                        noop="saved-tensor hooks already save no gathered weight")
    pipeline_loading_checkpoint: bool = key(False, "load checkpoints in pipeline mode", only=(False,),
                                            why="no pipeline engine")
    override_module_apply: bool = key(True, "gather parameters around module.apply",
                                      noop="zero3.Init always gathers around apply")
    log_trace_cache_warnings: bool = key(False, "log ZeRO-3 trace cache warnings", noop="nothing is logged")
    enable_sanity_checks: bool = key(False, "internal sanity checks", noop="the checks always run")
    save_muon_momentum_buffer_in_memory: bool = key(False, "Muon with NVMe", noop="no Muon")

    # ZenFlow: DeepSpeed 0.19.8's runtime/zenflow/ (ZenFlowConfig; ZenFlowZeroOptimizer refuses it without cpu offload)
    DEEPSPEED_ONLY = {"zenflow": "ZenFlow is ZeRO-Offload that steps the top-k gradient columns (topk_ratio) on the "
                      "device each step and the rest with a CPU Adam every update_interval steps, possibly "
                      "overlapped (stale by design); zero_ref has no selective update. Nearest: plain ZeRO-Offload, "
                      "every gradient stepped on the host each step: offload_optimizer {\"device\": \"cpu\"}",
                      "leaf_module": "ZeRO-3 leaf modules are not "
                      "implemented; ZeroStage3(unit_modules=...) groups a subtree into one unit"}
    REMOVED = {"mics_shard_size": "MiCS sharding", "mics_hierarchical_params_gather": "MiCS sharding",
               "zeropp_loco_param": "LoCo-ZeRO++"}


# ---------------------------------------------------------------- optimizer and scheduler

@dataclass(frozen=True)
class AdamParams:
    """``optimizer.params`` for type Adam / AdamW (DeepSpeed's FusedAdam / DeepSpeedCPUAdam signature)."""

    lr: float = key(1e-3, "learning rate", ge=0)
    betas: betas = key((0.9, 0.999), "Adam's (β1, β2)")
    eps: float = key(1e-8, "added to the denominator", ge=0)
    weight_decay: float | None = key(None, "0 with DeepSpeed's Adam; torch_adam: torch.optim's default "
                                           "(AdamW 0.01, Adam 0)", ge=0, zero_ref="used (None: 0, or torch's)")
    adam_w_mode: bool = key(True, "decoupled weight decay (AdamW); DeepSpeed's type 'Adam' is AdamW unless false")
    bias_correction: bool = key(True, "Adam's bias correction", only=(True,), why="always on")
    amsgrad: bool = key(False, "the AMSGrad variant", only=(False,), why="not implemented (FusedAdam refuses it too)")
    torch_adam: bool = key(False, "use torch.optim.Adam(W) instead of DeepSpeed's fused Adam",
                           zero_ref="used: same arithmetic, changes only the weight_decay default")
    set_grad_none: bool = key(True, "FusedAdam: set grads to None in zero_grad", noop="gradients live in flat buffers")
    fp32_optimizer_states: bool = key(True, "DeepSpeedCPUAdam's fp32 moments", only=(True,),
                                      why="Adam's moments are always fp32")
    foreach: bool | None = key(None, "torch_adam's foreach implementation", noop="one flat buffer per bucket")


@dataclass(frozen=True)
class OptimizerConfig:
    type: str = "AdamW"
    params: AdamParams = field(default_factory=AdamParams)

    @staticmethod
    def params_type():
        return AdamParams

    @property
    def adamw(self) -> bool:
        """Decoupled weight decay: type AdamW, or type Adam with adam_w_mode (DeepSpeed's default)."""
        return self.type.lower() == "adamw" or self.params.adam_w_mode

    @property
    def weight_decay(self) -> float:
        if self.params.weight_decay is not None:
            return self.params.weight_decay
        return 0.01 if self.params.torch_adam and self.adamw else 0.0  # FusedAdam/CPUAdam: 0; torch.optim.AdamW: 0.01


@dataclass(frozen=True)
class WarmupLRParams:
    warmup_min_lr: float = key(0.0, "rate before and at the start of the warm-up", ge=0)
    warmup_max_lr: float | None = key(None, "rate after the warm-up; None: the optimizer's lr", ge=0, docs=0.001)
    warmup_num_steps: int = key(1000, "steps of warm-up (at least 2 are used)", gt=0)
    warmup_type: str = key("log", "warm-up curve", choices=("log", "linear"))
    last_batch_iteration: int = key(-1, "resume position (-1: start)", ge=-1)


@dataclass(frozen=True)
class WarmupDecayLRParams(WarmupLRParams):
    warmup_max_lr: float | None = key(0.001, "rate after the warm-up", ge=0)
    total_num_steps: int | None = key(None, "step at which the rate reaches 0 (required)", gt=0, required=True)


@dataclass(frozen=True)
class WarmupCosineLRParams:
    total_num_steps: int | None = key(None, "step at which the cosine ends (required)", gt=0, required=True)
    warmup_min_ratio: float = key(0.0, "start of the warm-up, as a fraction of the optimizer's lr", ge=0)
    warmup_num_steps: int = key(1000, "steps of warm-up (at least 2 are used)", gt=0)
    cos_min_ratio: float = key(0.0001, "end of the cosine, as a fraction of the optimizer's lr", ge=0)
    warmup_type: str = key("log", "warm-up curve", choices=("log", "linear"))
    last_batch_iteration: int = key(-1, "resume position (-1: start)", ge=-1)


@dataclass(frozen=True)
class OneCycleParams:
    cycle_min_lr: float | None = key(None, "rate at both ends of the cycle (required)", ge=0, required=True)
    cycle_max_lr: float | None = key(None, "rate at the peak of the cycle (required)", ge=0, required=True)
    decay_lr_rate: float = key(0.0, "after the cycle: lr = cycle_min_lr / (1 + rate · steps / decay_step_size)", ge=0)
    cycle_first_step_size: int = key(2000, "steps from cycle_min_lr up to cycle_max_lr", gt=0)
    cycle_second_step_size: int | None = key(None, "steps back down (None: cycle_first_step_size)", ge=0)
    cycle_first_stair_count: int = key(0, "stairs on the way up (0: continuous)", ge=0)
    cycle_second_stair_count: int | None = key(None, "stairs on the way down (None: cycle_first_stair_count)", ge=0)
    decay_step_size: int = key(0, "steps per decay interval after the cycle (0: no decay)", ge=0)
    cycle_momentum: bool = key(True, "cycle Adam's beta1 opposite to the rate (beta2 becomes 0.99)")
    cycle_min_mom: float = key(0.8, "beta1 at the peak of the cycle", ge=0, le=1)
    cycle_max_mom: float = key(0.9, "beta1 at both ends of the cycle", ge=0, le=1)
    decay_mom_rate: float = key(0.0, "after the cycle: beta1 = cycle_max_mom · (1 + rate · steps / decay_step_size)",
                                ge=0)
    last_batch_iteration: int = key(-1, "resume position (-1: start)", ge=-1)


@dataclass(frozen=True)
class LRRangeTestParams:
    lr_range_test_min_lr: float = key(1e-3, "rate at the start", ge=0)
    lr_range_test_step_size: int = key(2000, "steps per increase interval", gt=0)
    lr_range_test_step_rate: float = key(1.0, "lr = min · (1 + rate · steps / step_size)", ge=0)
    lr_range_test_staircase: bool = key(False, "increase in stairs (floor of the interval) instead of continuously")
    last_batch_iteration: int = key(-1, "resume position (-1: start)", ge=-1)


SCHEDULER_PARAMS = {"WarmupLR": WarmupLRParams, "WarmupDecayLR": WarmupDecayLRParams,
                    "WarmupCosineLR": WarmupCosineLRParams, "OneCycle": OneCycleParams,
                    "LRRangeTest": LRRangeTestParams}


@dataclass(frozen=True)
class SchedulerConfig:
    type: str = "WarmupLR"
    params: object = field(default_factory=WarmupLRParams)


# ---------------------------------------------------------------- activation and model checkpoints

@dataclass(frozen=True)
class ActivationCheckpointingConfig:
    """Read here; used by ``zero_ref.activation_checkpointing.configure``."""

    partition_activations: bool = key(False, "shard saved activations over the model-parallel ranks")
    contiguous_memory_optimization: bool = key(False, "copy checkpoints into one contiguous buffer")
    cpu_checkpointing: bool = key(False, "keep checkpointed activations on the host")
    number_checkpoints: int | None = key(None, "checkpoints per forward (for the contiguous buffer)", ge=1)
    synchronize_checkpoint_boundary: bool = key(False, "synchronize the device at each checkpoint")
    profile: bool = key(False, "time the checkpointed forward passes")


@dataclass(frozen=True)
class CheckpointConfig:
    """``checkpoint``: read by zero_ref.checkpoint."""

    tag_validation: str = key("WARN", "check that every rank saves under the same tag: Ignore, Warn or Fail",
                              choices=("IGNORE", "WARN", "FAIL"), fold="upper")
    load_universal: bool = key(False, "load a universal (topology-free) checkpoint")
    use_node_local_storage: bool = key(False, "every node writes to its own disk")

    DEEPSPEED_ONLY = {"parallel_write": "pipeline-parallel checkpoint writes", "writer": "custom checkpoint writers"}


# ---------------------------------------------------------------- the whole file

_DS_ONLY_WHY = {
    "torch_autocast": "zero_ref casts the whole model (fp16/bf16); torch.autocast is not implemented",
    "pipeline": "zero_ref's engine takes a pipeline from a zero_ref.ds.pipe.PipelineModule, not from this section "
                "(DeepSpeed reads only stages, partition, seed_layers, activation_checkpoint_interval, "
                "pipe_partitioned and grad_partitioned here, ignoring any other key)",
    "tensor_parallel": "zero_ref's engine does not run tensor parallelism, whose building blocks are in "
                       "zero_ref.parallel (and DeepSpeed's key for the degree is tensor_parallel.autotp_size)",
    "expert_parallel": "zero_ref's engine does not run expert parallelism",
    "sequence_parallel_size": "zero_ref's engine does not run sequence parallelism",
    "flops_profiler": "no FLOPs profiler", "comms_logger": "zero_ref.comm.recording() counts the bytes instead",
    "tensorboard": "no monitors", "wandb": "no monitors", "csv_monitor": "no monitors", "comet": "no monitors",
    "timers": "wall_clock_breakdown times the step", "autotuning": "no autotuner (chapter 29 tunes with sim)",
    "hybrid_engine": "no inference kernels", "data_efficiency": "no data pipeline", "compile": "no torch.compile",
    "datastates_ckpt": "no DataStates checkpoints", "weight_quantization": "no quantization",
    "data_types": "gradients accumulate in the training dtype (fp32 masters)",
    "disable_allgather": "parameters are always all-gathered", "disable_python_gc": "no GC control",
    "vocabulary_size": "a DeepSpeed tensor-core warning only", "log_level": "no DeepSpeed logger",
    "use_data_before_expert_parallelism": "no expert parallelism",
    "seq_parallel_communication_data_type": "no sequence parallelism", "dump_state": "no state dump",
    "mesh_param": "no device mesh",
}
_REMOVED_WHY = {  # DeepSpeed 0.19's _REMOVED_TOP_LEVEL_CONFIG_KEYS
    "nebula": "Nebula checkpointing", "compression_training": "the compression library",
    "amp": "NVIDIA Apex AMP; use fp16 or bf16", "quantize_training": "Mixture-of-Quantization",
    "sparse_gradients": "sparse embedding-gradient compression", "eigenvalue": "eigenvalue-based MoQ",
    "sparse_attention": "Sparse Attention", "elasticity": "elastic training; set the batch keys directly",
    "graph_harvesting": "graph harvesting", "curriculum_learning": "top-level curriculum learning",
    "progressive_layer_drop": "Progressive Layer Dropping"}
_HINTS = {
    "micro_batch_size": "the per-rank micro-batch is train_micro_batch_size_per_gpu",
    "micro_batch_size_per_gpu": "the per-rank micro-batch is train_micro_batch_size_per_gpu",
    "batch_size": "use train_batch_size (global) or train_micro_batch_size_per_gpu (per rank)",
    "global_batch_size": "the global batch is train_batch_size",
    "gradient_accumulation": "use gradient_accumulation_steps",
    "max_grad_norm": "clipping is the top-level gradient_clipping", "grad_clip": "use gradient_clipping",
    "clip_grad": "use gradient_clipping", "lr_scheduler": "the section is called scheduler",
    "zero": "the section is called zero_optimization", "zero_stage": "use zero_optimization.stage",
    "data_parallel_size": "there is no such key: DeepSpeed takes the data-parallel size from the number of ranks "
                          "(world size / (tensor × pipeline parallel sizes))",
    "tensor_parallel_size": "there is no such key; DeepSpeed's is tensor_parallel.autotp_size (and zero_ref's "
                            "engine does not run tensor parallelism)",
    "pipeline_parallel_size": "there is no such key; DeepSpeed sets the pipeline depth in code "
                              "(PipelineModule(num_stages=...)), as zero_ref.ds.pipe does",
}


@dataclass(frozen=True)
class Config:
    """A whole DeepSpeed config, read and checked (``zero_ref.config.parse``)."""

    train_batch_size: int | None = key(None, "samples per optimizer step, all ranks together", gt=0)
    train_micro_batch_size_per_gpu: int | None = key(None, "samples per rank per forward/backward", gt=0,
                                                     docs="train_batch_size")
    gradient_accumulation_steps: int | None = key(None, "micro-batches per optimizer step", gt=0, docs=1)
    managed_gradient_accumulation: bool = key(True, "the engine tracks accumulation boundaries", only=(True,),
                                              why="the engine always counts micro-steps")
    optimizer: OptimizerConfig | None = key(None, "optimizer type and params", reader="optimizer")
    scheduler: SchedulerConfig | None = key(None, "learning-rate schedule type and params", reader="scheduler")
    fp16: FP16Config = key(factory=FP16Config, doc="fp16 mixed precision")
    bf16: BF16Config = key(factory=BF16Config, doc="bf16 mixed precision (alias: bfloat16)")
    zero_optimization: ZeroConfig = key(factory=ZeroConfig, doc="ZeRO stage and knobs")
    gradient_clipping: float = key(1.0, "clip the global gradient norm to this (0: off)", ge=0)
    steps_per_print: int | None = key(None, "print progress every this many optimizer steps (None: never)",
                                      ge=1, docs=10)
    wall_clock_breakdown: bool = key(False, "time forward, backward and step (printed with the progress)")
    memory_breakdown: bool = key(False, "print bytes held by category with the progress")
    zero_allow_untested_optimizer: bool = key(False, "allow an optimizer DeepSpeed has not tested with ZeRO")
    zero_force_ds_cpu_optimizer: bool = key(True, "refuse a client optimizer with ZeRO-Offload")
    communication_data_type: str | None = key(None, "dtype of gradient reduction (None: the training dtype)",
                                              choices=("fp16", "bf16", "fp32"), fold="lower")
    prescale_gradients: bool = key(False, "divide gradients before the reduction", only=(False,),
                                   why="gradients are averaged after the reduction")
    gradient_predivide_factor: float = key(1.0, "divide by this before, the rest after, the reduction", only=(1.0,),
                                           why="gradients are averaged after the reduction")
    gradient_allreduce_op: str = key("mean", "average (mean) or sum the gradients", choices=("mean", "sum"),
                                     fold="lower", only=("mean",), why="gradients are always averaged")
    dataloader_drop_last: bool = key(False, "drop the last incomplete batch of training_data")
    aio: AioConfig = key(factory=AioConfig, doc="asynchronous I/O for the NVMe tier")
    activation_checkpointing: ActivationCheckpointingConfig = key(factory=ActivationCheckpointingConfig,
                                                                  doc="activation checkpointing")
    checkpoint: CheckpointConfig = key(factory=CheckpointConfig, doc="model checkpoints")
    # filled in by parse, not read from the file:
    batch: object = field(default=None, metadata={"internal": True})
    notes: tuple = field(default=(), metadata={"internal": True})

    DEEPSPEED_ONLY = _DS_ONLY_WHY
    REMOVED = _REMOVED_WHY
    HINTS = _HINTS

    @property
    def precision(self) -> str:
        """'fp16', 'bf16' or 'fp32' (zero_ref.precision's names)."""
        return "fp16" if self.fp16.enabled else "bf16" if self.bf16.enabled else "fp32"

    def get(self, key: str, default=None):
        """A top-level key as DeepSpeed's ``engine.config`` (the config dict) gives it: a section as a dict
        (``engine.config.get("zero_optimization", {}).get("stage")``, as the HF Trainer reads it)."""
        names = {f.name for f in fields(self) if not f.metadata.get("internal")}
        if key not in names:
            return default
        value = getattr(self, key)
        return asdict(value) if is_dataclass(value) else value


def section_types() -> dict[str, type]:
    """Annotation name -> section dataclass, for the reader."""
    return {c.__name__: c for c in (FP16Config, BF16Config, OffloadOptimizerConfig, OffloadParamConfig, AioConfig,
                                    ZeroConfig, ActivationCheckpointingConfig, CheckpointConfig)}


# ---------------------------------------------------------------- the keys as a table (chapter 9)

def kind_of(f) -> tuple[str, bool]:
    """(base kind, optional) from a field's annotation string, e.g. 'int | None' -> ('int', True)."""
    parts = [p.strip() for p in str(f.type).split("|")]
    return parts[0], "None" in parts


def show(v) -> str:
    """A value as JSON writes it (true, null) where that differs from Python's repr."""
    return json.dumps(v) if isinstance(v, (bool, type(None))) else repr(v)


def defaults_table() -> list[dict]:
    """One row per key zero_ref reads: dotted key, DeepSpeed 0.19.8's code default, the documented
    default where the docs differ, what the key means, and what zero_ref does with it (``status``:
    "used", "default only" — other values are refused — or "no effect" — accepted and noted)."""
    rows = []

    def walk(cls, path: str):
        sections = section_types()
        for f in fields(cls):
            meta = f.metadata
            if meta.get("internal") or not f.init:
                continue
            key = f"{path}.{f.name}" if path else f.name
            kind = kind_of(f)[0]
            if meta.get("reader") == "optimizer":
                walk(OptimizerConfig.params_type(), "optimizer.params")
                continue
            if meta.get("reader") == "scheduler":
                for name, pcls in SCHEDULER_PARAMS.items():
                    walk(pcls, f"scheduler.params[{name}]")
                continue
            if kind in sections:
                walk(sections[kind], key)
                continue
            default = f.default if not callable(f.default_factory) else f.default_factory()
            status = ("no effect: " + meta["noop"] if meta.get("noop") else
                      f"only {' or '.join(show(o) for o in meta['only'])}: {meta['why']}" if meta.get("only")
                      is not None else meta.get("zero_ref", "used"))
            kind = "no effect" if meta.get("noop") else "default only" if meta.get("only") is not None else "used"
            rows.append({"key": key, "default": default, "docs": meta.get("docs"), "meaning": meta.get("doc", ""),
                         "zero_ref": status, "status": kind})

    walk(Config, "")
    return rows


def _fmt(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 10**4:
        if v == sys.maxsize:
            return "sys.maxsize"
        short = f"{v:.0e}".replace("e+0", "e").replace("e+", "e")
        return short if float(short) == v else str(v)
    return show(v) if isinstance(v, (str, bool, type(None))) else str(v)


def _(message: str) -> str:  # gettext: a Chinese-edition kernel binds the catalog (course/i18n.py)
    return gettext.dgettext("zero_lab", message)


def _status(status: str) -> str:
    """A row's ``zero_ref`` column in the reader's language: "used", "no effect: …", "only …: …"."""
    head, sep, why = status.partition(": ")
    if sep and head == "no effect":
        return _("no effect: {why}").format(why=_(why))
    if sep and head.startswith("only "):
        return _("only {values}: {why}").format(values=head[len("only "):], why=_(why))
    return _(status)


def format_defaults(prefix: str = "", *, keys=None, disagreements_only: bool = False) -> str:
    """``defaults_table()`` as aligned text: the keys that start with ``prefix`` (or exactly ``keys``)."""
    rows = [r for r in defaults_table() if (r["key"] in keys if keys is not None else r["key"].startswith(prefix))
            and (not disagreements_only or r["docs"] is not None)]
    cells = [(r["key"], _fmt(r["default"]), _fmt(r["docs"]) if r["docs"] is not None else "", _status(r["zero_ref"]))
             for r in rows]
    head = (_("key"), _("default"), _("docs say"))
    w = [max(len(c[i]) for c in cells + [(*head, "")]) for i in range(3)]
    lines = [f"{head[0]:<{w[0]}}  {head[1]:>{w[1]}}  {head[2]:>{w[2]}}  zero_ref"]
    lines += [f"{k:<{w[0]}}  {d:>{w[1]}}  {doc:>{w[2]}}  {z}" for k, d, doc, z in cells]
    return "\n".join(lines)
