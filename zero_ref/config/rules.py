"""DeepSpeed config rules that involve more than one key, and the batch arithmetic (pure Python).

``ConfigRules`` is mixed into zero_ref.config's reader, which provides ``error(key, rest)`` (record
one problem, its message starting with ``key``), ``limit(key, rest, note)`` (something only zero_ref
does not implement: an error, or a note when the reader is not strict) and ``notes`` (keys accepted
without effect):

- ``cross_rules``: fp16 with bf16, compute_grad_norm off outside stages 1-2, the reduction dtype
  against the training dtype (a limit), ZeRO-2/3 with a pipeline section, stage-3 keys below stage 3
  and ZeRO++ keys below stage 3 (a note), a schedule shorter than its warm-up (a note);
- ``offload_rules``: DeepSpeed's offload rules (which stage; partial offload at stage 3 only) and
  zero_ref's limits (NVMe needs its path at once; no partial offload; parameters on NVMe need the
  optimizer there too, on the same path);
- ``ranks_rules``: what needs the data-parallel size besides the batch (hpZ's sub-groups tile the ranks);
- ``batch_shape``: what the batch keys say without the data-parallel size (nothing, or no dp fits);
- ``batch``: zero_ref.config.batch's arithmetic on ``dp`` ranks, with a message that names the fix.
"""
from __future__ import annotations

import os

from zero_ref.config.batch import KEYS as BATCH_KEYS, BatchConfig, resolve_batch_sizes
from zero_ref.config.schema import Config, OffloadOptimizerConfig, OffloadParamConfig, show as _show

ZEROPP_KEYS = ("zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
               "zero_quantized_nontrainable_weights")


class ConfigRules:
    def cross_rules(self, cfg: Config, raw: dict) -> None:
        """Rules that involve more than one key."""
        zero = cfg.zero_optimization
        if cfg.fp16.enabled and cfg.bf16.enabled:
            self.error("fp16.enabled", "and bf16.enabled are both true; enable at most one of them (bf16 needs no "
                                       "loss scaling; fp16 uses the loss-scale keys)")
        if not zero.compute_grad_norm and zero.stage not in (1, 2):  # DeepSpeed's validator
            self.error("zero_optimization.compute_grad_norm", f"=false is supported by DeepSpeed only at stage 1 or 2, "
                                                              f"got stage {zero.stage}: remove the key")
        self.offload_rules(zero.stage, zero.offload_optimizer or OffloadOptimizerConfig(),
                           zero.offload_param or OffloadParamConfig(), cfg.aio)
        trained = "fp16" if cfg.fp16.enabled else "bf16" if cfg.bf16.enabled else "fp32"
        if cfg.communication_data_type not in (None, trained):
            self.limit("communication_data_type", f"={cfg.communication_data_type!r} differs from the training "
                                                  f"precision ({trained}); zero_ref reduces gradients in the "
                                                  f"training dtype: remove the key or set {trained!r}",
                       f"={cfg.communication_data_type!r}: zero_ref reduces gradients in the training dtype "
                       f"({trained})")
        if "pipeline" in raw and zero.stage >= 2:
            self.error("zero_optimization.stage", f"={zero.stage} with a 'pipeline' section: DeepSpeed's "
                                                  "PipelineEngine refuses ZeRO-2 and ZeRO-3 with pipeline "
                                                  "parallelism; use stage 0 or 1")
        given = raw.get("zero_optimization", {})
        if zero.stage != 3:
            for k in sorted(k for k in given if k.startswith("stage3_") or k in ZEROPP_KEYS):
                self.notes.append(f"zero_optimization.{k} has no effect at stage {zero.stage} (stage 3 only)")
        sch = cfg.scheduler
        if sch is not None and getattr(sch.params, "total_num_steps", None) is not None:
            if sch.params.total_num_steps < sch.params.warmup_num_steps:
                self.notes.append(f"scheduler.params.total_num_steps {sch.params.total_num_steps} < warmup_num_steps "
                                  f"{sch.params.warmup_num_steps}: the schedule never leaves its warm-up")
        self.batch_shape(cfg)

    def offload_rules(self, stage: int, opt, par, io) -> None:
        where = "zero_optimization.offload_optimizer"
        if opt.device != "none":
            if stage == 0:
                self.error(f"{where}.device", f"={opt.device!r} needs zero_optimization.stage 1, 2 or 3: ZeRO-Offload "
                                              "moves the rank's *partition* of the optimizer to the host, and stage 0 "
                                              "does not partition; got stage 0")
            elif opt.device == "nvme" and stage != 3:
                self.error(f"{where}.device", f"='nvme' (ZeRO-Infinity) needs zero_optimization.stage 3, got {stage}")
            if opt.device == "nvme" and not opt.nvme_path:
                self.limit(f"{where}.nvme_path", "must be set when device is 'nvme': the folder (on the NVMe drive) "
                                                 "that holds the swap files",
                           "is not set: DeepSpeed needs it when it creates the swap files")
            if opt.ratio < 1.0 and stage != 3:  # DeepSpeed's validator asserts it
                self.error(f"{where}.ratio", f"={opt.ratio} (partial offload) needs zero_optimization.stage 3 in "
                                             f"DeepSpeed, got stage {stage}: use 1.0")
            elif opt.ratio < 1.0:
                self.limit(f"{where}.ratio", f"={opt.ratio} (partial offload; DeepSpeed: stage 3 only) is not "
                                             "implemented in zero_ref: use 1.0",
                           f"={opt.ratio} (partial offload) is not implemented in zero_ref")
            if opt.super_offload:
                self.limit(f"{where}.super_offload", "=true is not supported by zero_ref; remove it",
                           "=true is not implemented in zero_ref")
        if par.device != "none":
            key = "zero_optimization.offload_param"
            if stage != 3:
                self.error(f"{key}.device", f"={par.device!r} needs zero_optimization.stage 3: only ZeRO-3 partitions "
                                            f"the parameters; got stage {stage}")
            elif par.device == "nvme" and opt.device != "nvme":
                self.limit(f"{key}.device", "='nvme' needs offload_optimizer.device='nvme' too in zero_ref (one "
                                            "versioned store commits parameters and optimizer states together)",
                           "='nvme' without the optimizer on NVMe is not implemented in zero_ref (one store)")
            elif par.device == "nvme" and opt.nvme_path and par.nvme_path and \
                    os.path.abspath(par.nvme_path) != os.path.abspath(opt.nvme_path):
                self.limit(f"{key}.nvme_path", "differs from offload_optimizer.nvme_path; zero_ref keeps one store "
                                               "per rank: use the same path",
                           "differs from offload_optimizer.nvme_path: zero_ref keeps one store per rank")

    # -------------------------------------------------------- batch arithmetic
    def batch_shape(self, cfg: Config) -> None:
        """What can be said about the batch keys without knowing the data-parallel size."""
        tbs, mbs, gas = cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps
        if tbs is None and mbs is None:
            self.error("train_batch_size", "is missing: set train_batch_size or train_micro_batch_size_per_gpu "
                                           "(gradient_accumulation_steps alone cannot determine the batch)")
        elif tbs is not None and mbs is not None and tbs % (mbs * (gas or 1)):
            self.error("train_batch_size", f"{tbs} is not a multiple of train_micro_batch_size_per_gpu {mbs}"
                                           + (f" × gradient_accumulation_steps {gas}" if gas else "")
                                           + ": no number of ranks satisfies train_batch_size = micro × "
                                             f"accumulation × data-parallel size; fix one of the keys")
        elif tbs is not None and gas is not None and tbs % gas:
            self.error("train_batch_size", f"{tbs} is not a multiple of gradient_accumulation_steps {gas}: no number "
                                           "of ranks satisfies train_batch_size = micro × accumulation × dp")

    def ranks_rules(self, cfg: Config, dp: int) -> None:
        """Rules that need the data-parallel size: hpZ's sub-groups tile the ranks. DeepSpeed takes
        min(zero_hpz_partition_size, world size) and asserts it divides the world size
        (utils/groups.py, ``_create_zero_param_parallel_group``)."""
        zero = cfg.zero_optimization
        g = min(zero.zero_hpz_partition_size, dp)
        if zero.stage == 3 and g > 1 and dp % g:
            self.error("zero_optimization.zero_hpz_partition_size",
                       f"={zero.zero_hpz_partition_size} does not divide the {dp} data-parallel ranks: hpZ's "
                       "sub-groups are consecutive ranks (a node) that tile them; use the ranks per node, a "
                       f"divisor of {dp}, or 1 to turn hpZ off")

    def batch(self, cfg: Config, dp: int) -> BatchConfig | None:
        """DeepSpeed's arithmetic (zero_ref.config.batch) on ``dp`` ranks, with a message that names the fix."""
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
            self.error("dp", f"(the data-parallel size) must be a positive integer, got {_show(dp)}")
            return None
        tbs, mbs, gas = cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps
        try:
            return resolve_batch_sizes(tbs, mbs, gas, dp=dp)
        except ValueError:
            pass
        got = (tbs, mbs, gas)
        rtbs = tbs if tbs is not None else (mbs or 0) * (gas or 1) * dp
        rgas = gas if gas is not None else (rtbs // (mbs or 1) // dp if mbs else 1)
        rmbs = mbs if mbs is not None else rtbs // dp // rgas
        for key, given, value in zip(BATCH_KEYS, got, (rtbs, rmbs, rgas)):
            if given is None and value <= 0:
                per = rgas * dp if key == BATCH_KEYS[1] else (mbs or 1) * dp
                self.error(key, f"resolves to {value} on {dp} data-parallel ranks: train_batch_size {tbs} is smaller "
                                f"than {per} (= {'gradient_accumulation_steps' if key == BATCH_KEYS[1] else 'micro'} "
                                f"× data-parallel size); raise train_batch_size to a multiple of {per} or use fewer "
                                "ranks")
                return None
        per_rank = rtbs // dp if rtbs % dp == 0 else None
        good = [d for d in range(1, 1025) if _fits(tbs, mbs, gas, d)][:8]
        self.error("train_batch_size", f"{rtbs} != train_micro_batch_size_per_gpu {rmbs} × gradient_accumulation_"
                                       f"steps {rgas} × data-parallel size {dp} (= {rmbs * rgas * dp})"
                                       + ("" if per_rank else f": {rtbs} does not divide by {dp} ranks")
                                       + "; fix the batch keys, or run on "
                                       + (f"{', '.join(map(str, good))} data-parallel ranks" if good else
                                          "another number of ranks"))
        return None


def _fits(tbs, mbs, gas, dp) -> bool:
    try:
        resolve_batch_sizes(tbs, mbs, gas, dp=dp)
        return True
    except ValueError:
        return False
