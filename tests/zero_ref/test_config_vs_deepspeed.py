"""zero_ref.config's defaults and batch arithmetic are DeepSpeed 0.19.8's: its own config classes, instantiated.

Where DeepSpeed's docs say otherwise, the code wins (chapter 9 lists those keys); this file checks
the code values. It also checks that every top-level key DeepSpeed's config reads is one zero_ref
knows (implemented, refused as unsupported, or refused as removed), and DeepSpeed's verdicts on the
seed's two example configs, which chapter 9 quotes.
"""
import inspect
import os
from dataclasses import fields

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed")

import zero_ref  # noqa: E402
from zero_ref import config as C  # noqa: E402
from zero_ref.config import schema as S  # noqa: E402
from zero_ref.precision import FP16_DEFAULTS  # noqa: E402


def ours(cls) -> dict:
    return {f.name: (f.default_factory() if callable(f.default_factory) else f.default)
            for f in fields(cls) if f.init and not f.metadata.get("internal")}


def pydantic_defaults(model) -> dict:
    """JSON key (the alias, where there is one) -> default, from an instance with no arguments."""
    inst = model()
    return {(f.alias or name): getattr(inst, name) for name, f in type(inst).model_fields.items()}


def test_zero_optimization_defaults():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    theirs, mine = pydantic_defaults(DeepSpeedZeroConfig), ours(S.ZeroConfig)
    mine["overlap_comm"] = False  # both resolve None by the stage: off at stage 0
    deprecated = {"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
                  "stage3_gather_fp16_weights_on_model_save"}  # read by zero_ref.config's deprecated_zero_keys
    for k, v in theirs.items():
        if k in deprecated or k in S.ZeroConfig.DEEPSPEED_ONLY:
            continue
        assert k in mine, f"zero_optimization.{k} is missing from the schema"
        assert mine[k] == v, (k, mine[k], v)
    assert set(mine) <= set(theirs)
    assert DeepSpeedZeroConfig(stage=3).overlap_comm is True
    assert C.parse({"train_batch_size": 1, "zero_optimization": {"stage": 3}}).zero_optimization.overlap_comm is True


@pytest.mark.parametrize("name", ["OffloadOptimizer", "OffloadParam"])
def test_offload_defaults(name):
    from deepspeed.runtime.zero import offload_config as oc
    theirs = pydantic_defaults(getattr(oc, f"DeepSpeedZero{name}Config"))
    mine = ours(getattr(S, f"{name}Config"))
    theirs["device"] = getattr(theirs["device"], "value", theirs["device"])
    assert mine == theirs


def test_precision_defaults():
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    assert ours(S.FP16Config) == pydantic_defaults(DeepSpeedFP16Config) == FP16_DEFAULTS
    assert ours(S.BF16Config) == pydantic_defaults(DeepSpeedBF16Config)


def test_aio_and_activation_checkpointing_defaults():
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT
    from deepspeed.runtime.swap_tensor.aio_config import AIO_DEFAULT_DICT
    assert ours(S.AioConfig) == AIO_DEFAULT_DICT
    assert ours(S.ActivationCheckpointingConfig) == ACT_CHKPT_DEFAULT


def test_top_level_defaults():
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime import constants as K
    ds = DeepSpeedConfig({"train_batch_size": 1})  # no process group: DeepSpeed takes world size 1
    mine = C.parse({"train_batch_size": 1})
    for k in ("gradient_clipping", "steps_per_print", "wall_clock_breakdown", "memory_breakdown",
              "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "communication_data_type",
              "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op", "dataloader_drop_last",
              "managed_gradient_accumulation"):
        assert getattr(mine, k) == getattr(ds, k), k
    assert mine.gradient_clipping == 1.0  # 0.19.8's code (older releases: 0.0)
    assert mine.checkpoint.tag_validation == K.CHECKPOINT_TAG_VALIDATION_DEFAULT
    assert (mine.checkpoint.load_universal, mine.checkpoint.use_node_local_storage) == \
        (ds.load_universal_checkpoint, ds.use_node_local_storage)


def test_optimizer_and_scheduler_defaults():
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from deepspeed.runtime import config as dsc, lr_schedules
    fused = {k: p.default for k, p in inspect.signature(FusedAdam.__init__).parameters.items()
             if p.default is not inspect.Parameter.empty}
    mine = ours(S.AdamParams)
    for k in ("lr", "eps", "bias_correction", "amsgrad", "set_grad_none", "adam_w_mode"):
        assert mine[k] == fused[k], k
    assert mine["betas"] == tuple(fused["betas"]) and mine["adam_w_mode"] == dsc.ADAM_W_MODE_DEFAULT
    assert C.parse({"train_batch_size": 1, "optimizer": {"type": "Adam"}}).optimizer.weight_decay == fused["weight_decay"]
    assert mine["fp32_optimizer_states"] == inspect.signature(DeepSpeedCPUAdam.__init__).parameters[
        "fp32_optimizer_states"].default
    for name, cls in S.SCHEDULER_PARAMS.items():
        sig = {k: p.default for k, p in inspect.signature(getattr(lr_schedules, name).__init__).parameters.items()
               if k not in ("self", "optimizer")}
        sig = {k: (None if v is inspect.Parameter.empty else v) for k, v in sig.items()}  # total_num_steps: required
        assert ours(cls) == sig, name


def recorded_top_level_keys() -> set:
    """The top-level keys DeepSpeedConfig reads, recorded by a dict that watches its lookups."""
    from deepspeed.runtime.config import DeepSpeedConfig
    seen = set()

    class Keys:
        def __init__(self, d):
            self.d = d

        def __contains__(self, k):
            seen.add(k)
            return dict.__contains__(self.d, k)

        def __iter__(self):
            return iter(dict.keys(self.d))

    class Watched(dict):
        def __getitem__(self, k):
            seen.add(k)
            return dict.__getitem__(self, k)

        def get(self, k, default=None):
            seen.add(k)
            return dict.get(self, k, default)

        def __contains__(self, k):
            seen.add(k)
            return dict.__contains__(self, k)

        def keys(self):
            return Keys(self)

    DeepSpeedConfig(Watched({"train_batch_size": 1}))
    return seen


def test_every_key_deepspeed_reads_is_known():
    seen = recorded_top_level_keys()
    assert len(seen) > 40
    known = ({f.name for f in fields(S.Config) if f.init and not f.metadata.get("internal")} | {"bfloat16"}
             | set(S.Config.DEEPSPEED_ONLY) | set(S.Config.REMOVED))
    assert seen - known == set()


# ------------------------------------------------------------------ batch arithmetic and the seed configs

def deepspeed_verdicts(rank, world, cases):
    """DeepSpeed's DeepSpeedConfig on each (config, dp): resolved batch triple, or the exception's type."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig
    deepspeed.init_distributed(dist_backend="gloo")

    class MPU:  # DeepSpeed takes the data-parallel size from an mpu when there is one
        def __init__(self, dp):
            self.dp = dp

        def get_data_parallel_world_size(self):
            return self.dp

    out = []
    for config, dp in cases:
        try:
            c = DeepSpeedConfig(dict(config), mpu=MPU(dp))
            out.append((c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps))
        except Exception as e:  # AssertionError for the batch, pydantic's ValidationError for unknown sub-keys
            out.append(type(e).__name__)
    return out


SEED1 = {"train_batch_size": 32, "gradient_accumulation_steps": 4, "fp16": {"enabled": True, "initial_scale_power": 12},
         "zero_optimization": {"stage": 2, "allgather_partitions": True, "reduce_scatter": True, "overlap_comm": True}}
SEED3 = {"train_batch_size": 1024, "gradient_accumulation_steps": 4,
         "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                               "allgather_partitions": True, "overlap_comm": True},
         "tensor_parallel": {"tp_size": 8}, "pipeline": {"pp_size": 4, "micro_batch_size": 8}}
SEED3_NO_TP = {k: v for k, v in SEED3.items() if k != "tensor_parallel"}
BATCHES = [(t, m, g) for t in (None, 12, 32, 48) for m in (None, 1, 2, 3) for g in (None, 1, 2, 4)]


@pytest.mark.slow
@pytest.mark.peers
def test_batch_arithmetic_and_seed_verdicts_equal_deepspeeds():
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    grid = [({k: v for k, v in zip(keys, b) if v is not None}, dp) for b in BATCHES for dp in (1, 2, 3, 4)]
    seeds = [(SEED1, dp) for dp in (1, 2, 3, 4, 8, 16)] + [(SEED3, 1), (SEED3_NO_TP, 1), (SEED3_NO_TP, 32)]
    theirs = zero_ref.launch(deepspeed_verdicts, 1, grid + seeds, timeout=300, echo=False)[0]
    for (config, dp), verdict in zip(grid, theirs):
        if not any(k in config for k in keys[:2]):
            assert verdict == "AssertionError"
            continue
        mine = C.problems(config, dp=dp)
        if isinstance(verdict, tuple):  # DeepSpeed accepts: so do we, with the same three numbers
            b = C.parse(config, dp=dp).batch
            assert not mine and (b.train_batch_size, b.train_micro_batch_size_per_gpu, b.gradient_accumulation_steps) == verdict
        else:
            assert mine and mine[0].key in keys, (config, dp, verdict)
    s1, s3, s3_no_tp = theirs[len(grid):len(grid) + 6], theirs[-3], theirs[-2:]
    assert s1 == [(32, 8, 4), (32, 4, 4), "AssertionError", (32, 2, 4), (32, 1, 4), "AssertionError"]
    assert s3 == "ValidationError"  # tensor_parallel.tp_size: DeepSpeed 0.19.8's key is autotp_size
    # Without it DeepSpeed accepts the file and silently ignores pipeline.micro_batch_size: on 32 GPUs as
    # TP 8 × PP 4 (dp 1) each micro-batch is 256 sequences, not 8; it is 8 only with dp = 32 (1024 GPUs).
    assert s3_no_tp == [(1024, 256, 4), (1024, 8, 4)]
