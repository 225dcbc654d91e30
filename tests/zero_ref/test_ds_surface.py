"""The names DeepSpeed scripts import exist under zero_ref.ds with DeepSpeed 0.19.8's signatures, and behave as
DeepSpeed's: a script's `import deepspeed` lines resolve after `import zero_ref.ds as deepspeed`."""
import importlib
import inspect
import os

import numpy as np
import pytest
import torch

import zero_ref

# (DeepSpeed's module, zero_ref's module, names a script imports from it)
SURFACE = [
    ("deepspeed", "zero_ref.ds", ["initialize", "init_distributed", "add_config_arguments", "tp_model_init",
                                  "init_inference"]),
    ("deepspeed.runtime.utils", "zero_ref.ds.runtime.utils", ["set_random_seed", "move_to_device", "see_memory_usage",
                                                           "partition_uniform", "partition_balanced"]),
    ("deepspeed.utils", "zero_ref.ds.utils", ["RepeatingLoader"]),
    ("deepspeed.ops.adam", "zero_ref.ds.ops.adam", ["FusedAdam", "DeepSpeedCPUAdam"]),
    ("deepspeed.pipe", "zero_ref.ds.pipe", ["PipelineModule", "LayerSpec", "TiedLayerSpec"]),
]


@pytest.fixture
def deepspeed(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    return pytest.importorskip("deepspeed")


def parameters(obj) -> list[str]:
    f = obj.__init__ if inspect.isclass(obj) else obj
    return [n for n in inspect.signature(f).parameters if n not in ("self", "args", "kwargs", "super_args",
                                                                      "super_kwargs")]


# deepspeed.X -> zero_ref.ds.X: every module a script imports from, and the names it takes from each
ALIASED = [
    ("deepspeed", ["initialize", "init_distributed", "add_config_arguments", "tp_model_init", "init_inference",
                   "zero", "checkpointing", "comm", "__version__"]),
    ("deepspeed.comm", ["init_distributed", "get_rank", "get_world_size", "get_local_rank", "get_global_rank",
                        "get_all_ranks_from_group", "get_world_group", "is_initialized", "barrier", "new_group",
                        "all_reduce", "all_gather", "all_gather_into_tensor", "allgather_fn", "reduce_scatter",
                        "reduce_scatter_tensor", "reduce_scatter_fn", "all_to_all_single", "broadcast", "ReduceOp"]),
    ("deepspeed.zero", ["Init", "GatheredParameters", "register_external_parameter"]),
    ("deepspeed.checkpointing", ["checkpoint", "configure", "is_configured", "get_cuda_rng_tracker",
                                 "model_parallel_cuda_manual_seed"]),
    ("deepspeed.accelerator", ["get_accelerator"]),
    ("deepspeed.runtime.lr_schedules", ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"]),
    ("deepspeed.runtime.utils", ["set_random_seed", "move_to_device", "see_memory_usage"]),
    ("deepspeed.runtime.dataloader", ["RepeatingLoader"]),
    ("deepspeed.utils", ["RepeatingLoader", "logger"]),
    ("deepspeed.utils.zero_to_fp32", ["get_fp32_state_dict_from_zero_checkpoint",
                                      "convert_zero_checkpoint_to_fp32_state_dict",
                                      "load_state_dict_from_zero_checkpoint"]),
    ("deepspeed.ops.adam", ["FusedAdam", "DeepSpeedCPUAdam"]),
    ("deepspeed.pipe", ["PipelineModule", "LayerSpec", "TiedLayerSpec"]),
    ("deepspeed.moe.layer", ["MoE"]),
    ("deepspeed.moe.utils", ["split_params_into_different_moe_groups_for_optimizer"]),
]


@pytest.mark.parametrize("theirs,names", ALIASED, ids=[a[0] for a in ALIASED])
def test_deepspeeds_module_paths_resolve_under_zero_ref_ds(theirs, names):
    ours = importlib.import_module(theirs.replace("deepspeed", "zero_ref.ds", 1))
    assert [n for n in names if not hasattr(ours, n)] == []


@pytest.mark.parametrize("theirs,ours,names", SURFACE, ids=[s[0] for s in SURFACE])
def test_scripts_imports_resolve_with_deepspeeds_arguments(deepspeed, theirs, ours, names):
    ds_mod, zr_mod = importlib.import_module(theirs), importlib.import_module(ours)
    for name in names:
        mine, real = getattr(zr_mod, name), getattr(ds_mod, name)
        if name in ("initialize", "init_inference"):  # newer keywords of DeepSpeed's that zero_ref does not take
            assert set(parameters(mine)) <= set(parameters(real)) | {"config"}, name
            continue
        assert parameters(mine)[:len(parameters(real))] == parameters(real) or \
            parameters(mine) == parameters(real)[:len(parameters(mine))], (name, parameters(mine), parameters(real))


def test_version_is_the_deepspeed_api_it_follows(deepspeed):
    assert zero_ref.__version__ == deepspeed.__version__ == "0.19.8"


def test_set_random_seed_seeds_what_deepspeeds_seeds(deepspeed):
    import random
    from deepspeed.runtime import utils as ds_utils
    from zero_ref.ds.runtime import utils
    draws = []
    for seed_fn in (ds_utils.set_random_seed, utils.set_random_seed):
        seed_fn(2 ** 40 + 3)  # beyond numpy's 32 bits: both take it modulo 2**32
        draws.append((random.random(), np.random.rand(), torch.rand(3)))
    assert draws[0][0] == draws[1][0] and draws[0][1] == draws[1][1] and torch.equal(draws[0][2], draws[1][2])


def test_move_to_device_and_repeating_loader():
    from zero_ref.ds.runtime.utils import move_to_device
    from zero_ref.ds.utils import RepeatingLoader
    nested = {"a": [torch.ones(1), (torch.zeros(2),)]}
    moved = move_to_device(nested, torch.device("cpu"))
    assert torch.equal(moved["a"][1][0], torch.zeros(2)) and isinstance(moved["a"][1], tuple)
    loader = RepeatingLoader([1, 2, 3])
    assert [next(loader) for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]


def test_ds_adams_have_deepspeeds_defaults_and_step_as_adamw(deepspeed):
    from deepspeed.ops.adam import DeepSpeedCPUAdam as DsCPU, FusedAdam as DsFused
    from zero_ref.ds.ops.adam import DeepSpeedCPUAdam, FusedAdam

    def defaults(cls):
        return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    assert defaults(FusedAdam) == defaults(DsFused) and defaults(DeepSpeedCPUAdam) == defaults(DsCPU)
    torch.manual_seed(0)
    w = torch.randn(5)
    runs = []
    for make in (lambda p: FusedAdam(p, lr=0.1, weight_decay=0.2),
                 lambda p: DeepSpeedCPUAdam(p, lr=0.1, weight_decay=0.2),
                 lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.2)):
        p = torch.nn.Parameter(w.clone())
        opt = make([p])
        for _ in range(3):
            p.grad = torch.sin(p.detach() * 3)
            opt.step()
        runs.append(p.detach())
    assert torch.equal(runs[0], runs[2]) and torch.equal(runs[1], runs[2])
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam([torch.nn.Parameter(w)], amsgrad=True)
    with pytest.raises(ValueError, match="torch.optim.Adam"):
        FusedAdam([torch.nn.Parameter(w)], adam_w_mode=False)


def test_offload_takes_a_deepspeed_cpu_adam_as_deepspeed_does(one_rank):
    """DeepSpeed refuses a client optimizer with ZeRO-Offload unless it is its DeepSpeedCPUAdam (runtime/engine.py,
    _configure_basic_optimizer); so does zero_ref."""
    from zero_ref.ds.ops.adam import DeepSpeedCPUAdam
    from zero_ref.config import ConfigError
    cfg = {"train_batch_size": 2, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    model = torch.nn.Linear(4, 2)
    engine, optimizer, *_ = zero_ref.initialize(model=model, optimizer=DeepSpeedCPUAdam(model.parameters(), lr=0.1),
                                                config=cfg)
    assert engine.zero_optimization_stage() == 2 and engine.get_lr() == [0.1]
    with pytest.raises(ConfigError, match="zero_force_ds_cpu_optimizer"):
        zero_ref.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg)


def test_autotp_and_inference_are_refused_naming_what_is_supported():
    with pytest.raises(NotImplementedError, match="TensorParallelGPT"):
        zero_ref.tp_model_init(torch.nn.Linear(2, 2), tp_size=2, dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="no inference engine"):
        zero_ref.init_inference(torch.nn.Linear(2, 2))


def test_runtime_submodules_are_attributes_after_a_bare_import():
    """``deepspeed.runtime.utils.set_random_seed(...)`` after only ``import deepspeed`` (pipeline_parallelism/train.py
    writes it): a fresh interpreter, where nothing has imported ``runtime.utils`` yet."""
    import subprocess
    import sys
    code = ("import zero_ref.ds as deepspeed, torch\n"
            "deepspeed.runtime.utils.set_random_seed(5); a = torch.rand(1)\n"
            "torch.manual_seed(5); assert torch.equal(a, torch.rand(1))\n"
            "try:\n    deepspeed.runtime.no_such_module\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "module 'zero_ref.ds.runtime' has no attribute 'no_such_module'" in out.stdout
