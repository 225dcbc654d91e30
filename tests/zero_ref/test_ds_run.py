"""A DeepSpeed script run unedited on zero_ref: the ``deepspeed`` alias (zero_ref.ds.alias), the ``zero-ref``
launcher's arguments (zero_ref.ds.launcher.runner), and a HuggingFace Trainer script (tests/clients/hf_trainer.py)
giving DeepSpeed 0.19.8's logged losses at ZeRO-2 and ZeRO-3 (fp32: 1e-6 relative, 1e-5 absolute)."""
import json
import re
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import PEER_RUN, ROOT, free_port, torchrun_env
from zero_ref.ds.launcher import runner as launcher

# What DeepSpeedExamples' training scripts, DeepSpeed-Chat, transformers 5.23 (integrations/deepspeed.py,
# modeling_utils.py) and accelerate 1.15 (accelerator.py, state.py, utils/deepspeed.py, utils/other.py) take from
# DeepSpeed, by module: each resolves to zero_ref.ds ...
RESOLVES = {
    "deepspeed": ["initialize", "init_distributed", "add_config_arguments", "zero", "comm", "checkpointing",
                  "DeepSpeedEngine", "PipelineModule", "get_accelerator", "logger", "__version__"],
    "deepspeed.comm": ["init_distributed", "get_rank", "get_world_size", "get_local_rank", "barrier", "new_group",
                       "is_initialized", "all_reduce", "all_gather", "broadcast", "ReduceOp"],
    "deepspeed.accelerator": ["get_accelerator"],
    "deepspeed.zero": ["Init", "GatheredParameters", "register_external_parameter"],
    "deepspeed.runtime.zero": ["Init", "GatheredParameters"],
    "deepspeed.runtime.zero.partition_parameters": ["ZeroParamStatus", "GatheredParameters", "Init",
                                                    "zero_wrapper_for_fp_tensor_constructor", "_orig_torch_arange"],
    "deepspeed.runtime.engine": ["DeepSpeedEngine"],
    "deepspeed.runtime.utils": ["set_random_seed", "move_to_device", "see_memory_usage"],
    "deepspeed.runtime.lr_schedules": ["VALID_LR_SCHEDULES", "WarmupLR", "WarmupDecayLR", "OneCycle"],
    "deepspeed.runtime.dataloader": ["RepeatingLoader"],
    "deepspeed.utils": ["logger", "RepeatingLoader"],
    "deepspeed.utils.logging": ["logger"],
    "deepspeed.utils.module_utils": ["recursive_getattr", "recursive_setattr"],
    "deepspeed.compression.helper": ["recursive_getattr", "recursive_setattr"],
    "deepspeed.checkpoint.utils": ["clone_tensors_for_torch_save"],
    "deepspeed.checkpointing": ["checkpoint", "configure"],
    "deepspeed.ops.adam": ["FusedAdam", "DeepSpeedCPUAdam"],
    "deepspeed.ops.adagrad": ["DeepSpeedCPUAdagrad"],
    "deepspeed.ops.lion": ["FusedLion", "DeepSpeedCPULion"],
    "deepspeed.pipe": ["PipelineModule", "LayerSpec", "TiedLayerSpec"],
    "deepspeed.moe.layer": ["MoE"],
    "deepspeed.moe.utils": ["split_params_into_different_moe_groups_for_optimizer"],
}
# ... or fails where it is reached, naming the missing module or name (import statement, the name it names)
FAILS = [
    ("import deepspeed.ops.sparse_attention", "sparse_attention"),
    ("from deepspeed.ops.sparse_attention import FixedSparsityConfig", "sparse_attention"),
    ("from deepspeed import DeepSpeedTransformerLayer", "DeepSpeedTransformerLayer"),
    ("from deepspeed import DeepSpeedConfig", "DeepSpeedConfig"),
    ("from deepspeed import replace_transformer_layer", "replace_transformer_layer"),
    ("import deepspeed.module_inject", "module_inject"),
    ("from deepspeed.runtime.data_pipeline.data_routing.helper import convert_to_random_ltd", "data_pipeline"),
    ("from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum", "offload_config"),
    ("from deepspeed.runtime.domino.transformer import DominoTransformer", "domino"),
    ("from deepspeed.runtime.config import LAMB_OPTIMIZER", "config"),
    ("from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF", "sequence_parallel"),
    ("from deepspeed.utils import groups", "groups"),
    ("from deepspeed.utils import set_z3_leaf_modules", "set_z3_leaf_modules"),
    ("from deepspeed.ops.lamb import FusedLamb", "lamb"),
    ("from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME", "DEEPSPEED_ENVIRONMENT_NAME"),
    ("from deepspeed.launcher.launch import main", "launch"),
]

CHECK = textwrap.dedent("""
    import importlib, importlib.metadata, importlib.util, json, sys
    from zero_ref.ds.alias import install
    install()
    resolves, fails = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    out = {"resolves": {}, "fails": []}
    for module, names in resolves.items():
        m = importlib.import_module(module)
        out["resolves"][module] = [m.__name__, [n for n in names if not hasattr(m, n)]]
    for statement, _ in fails:
        try:
            exec(statement, {})
            out["fails"].append([statement, None, ""])
        except ImportError as e:
            out["fails"].append([statement, type(e).__name__, str(e)])
    import deepspeed
    try:
        deepspeed.utils.groups
    except AttributeError as e:
        out["attribute"] = str(e)
    out["hasattr"] = hasattr(deepspeed.utils, "groups")
    out["real"] = sorted(n for n, m in sys.modules.items() if "site-packages/deepspeed" in str(getattr(m, "__file__", "")))
    print("RESULT " + json.dumps(out))
""")

# makes the real DeepSpeed invisible (as if not installed) before the alias goes in
HIDE_REAL = textwrap.dedent("""
    import importlib.machinery, importlib.metadata, importlib.util, json
    find_spec, find_dists = importlib.machinery.PathFinder.find_spec, importlib.machinery.PathFinder.find_distributions
    importlib.machinery.PathFinder.find_spec = classmethod(
        lambda cls, name, path=None, target=None: None if name.split(".")[0] == "deepspeed" else find_spec(name, path, target))
    importlib.machinery.PathFinder.find_distributions = classmethod(
        lambda cls, context=importlib.metadata.DistributionFinder.Context(): (
            d for d in find_dists(context) if d.metadata["Name"] != "deepspeed"))
    before = [importlib.util.find_spec("deepspeed") is not None]
    try:
        importlib.metadata.version("deepspeed"); before.append(True)
    except importlib.metadata.PackageNotFoundError:
        before.append(False)
    from zero_ref.ds.alias import install
    install()
    from transformers.integrations.deepspeed import is_deepspeed_available as hf
    from accelerate.utils import is_deepspeed_available as acc
    import deepspeed
    print("RESULT " + json.dumps({"before": before, "spec": importlib.util.find_spec("deepspeed").name,
          "version": importlib.metadata.version("deepspeed"), "transformers": hf(), "accelerate": acc(),
          "module": deepspeed.__name__}))
""")


def python(code: str, *args: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "DS_ACCELERATOR": "cpu", **env})
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_alias_resolves_to_zero_ref_or_fails_naming_the_missing_name():
    got = python(CHECK, json.dumps(RESOLVES), json.dumps(FAILS))
    for module, (name, missing) in got["resolves"].items():
        assert name == "zero_ref.ds" + module[len("deepspeed"):], module
        assert missing == [], (module, missing)
    for (statement, named), (_, kind, message) in zip(FAILS, got["fails"]):
        assert kind in ("ImportError", "ModuleNotFoundError"), statement
        assert named in message and "zero_ref" in message and "it provides" in message, (statement, message)
    assert "deepspeed.utils.groups" in got["attribute"] and "RepeatingLoader" in got["attribute"]
    assert got["hasattr"] is False  # a missing name is still an AttributeError for hasattr
    assert got["real"] == []  # nothing reached the installed DeepSpeed


def test_alias_answers_find_spec_and_metadata_without_deepspeed_installed():
    got = python(HIDE_REAL)
    assert got["before"] == [False, False]  # the installed DeepSpeed is hidden
    assert got["spec"] == "deepspeed" and got["version"] == "0.19.8" and got["module"] == "zero_ref.ds"
    assert got["transformers"] is True and got["accelerate"] is True


# ---------------------------------------------------------------- the zero-ref launcher's arguments

def slots(*argv, pool=1):
    return launcher.resources(launcher.parse_args([*argv, "train.py"]), pool=pool)


def test_launcher_counts_ranks_as_deepspeeds_launcher():
    assert slots() == [0]  # a CPU machine: one slot per NUMA node (or LOCAL_SIZE)
    assert slots(pool=4) == [0, 1, 2, 3]
    assert slots("--num_gpus", "2") == [0, 1] == slots("--num_accelerators", "2")
    assert slots("--num_nodes", "1", "--num_gpus", "3") == [0, 1, 2]
    assert slots("--include", "localhost:1,3", pool=4) == [1, 3]
    assert slots("--include", "localhost", pool=2) == [0, 1]
    assert slots("--exclude", "localhost:1", pool=3) == [0, 2]


@pytest.mark.parametrize("argv, named", [
    (["--hostfile", "hosts"], "--hostfile"),
    (["--num_nodes", "2"], "--num_nodes"),
    (["--include", "worker-1:0,1"], "worker-1"),
    (["--include", "localhost:0@worker-1:0"], "several hosts"),
    (["--include", "localhost:0,1"], "no slot 1"),  # as DeepSpeed's: slots are the pool's
    (["--include", "localhost:0", "--num_gpus", "2"], "--num_gpus"),
    (["--include", "localhost:0", "--exclude", "localhost:1"], "mutually exclusive"),
    (["--node_rank", "1"], "--node_rank"),
    (["--launcher", "openmpi"], "--launcher"),
    (["--no_python"], "--no_python"),
    (["--autotuning", "tune"], "--autotuning"),
    (["--bind_cores_to_rank"], "--bind_cores_to_rank"),
    (["--master_addr", "10.0.0.7"], "--master_addr"),
])
def test_launcher_refuses_what_it_cannot_honour_naming_it(argv, named):
    with pytest.raises(launcher.LaunchError, match=named.replace("@", ".")):
        slots(*argv)


def test_launcher_command_appends_local_rank_unless_told_not_to():
    a = launcher.parse_args(["--num_gpus", "2", "train.py", "--deepspeed", "--deepspeed_config", "ds.json"])
    assert launcher.rank_command(a) == ["-m", "zero_ref.ds.run", "--local_rank_arg", "train.py", "--deepspeed",
                                        "--deepspeed_config", "ds.json"]
    a = launcher.parse_args(["--no_local_rank", "--module", "pkg.train", "--epochs", "1"])
    assert launcher.rank_command(a) == ["-m", "zero_ref.ds.run", "-m", "pkg.train", "--epochs", "1"]


def test_run_passes_local_rank_right_after_the_script(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import json, sys\nimport deepspeed\nprint('RESULT ' + json.dumps([sys.argv, deepspeed.__name__]))\n")
    got = python("from zero_ref.ds.run import main; main()", "--local_rank_arg", str(script), "--x", "1",
                 LOCAL_RANK="3")
    assert got == [[str(script), "--local_rank=3", "--x", "1"], "zero_ref.ds"]


@pytest.mark.slow
def test_launcher_starts_two_ranks_on_zero_ref(tmp_path):
    """``zero-ref --num_gpus 2`` on a script with ``from deepspeed import comm as dist``: two ranks, each told its
    --local_rank, joined through zero_ref's comm."""
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent("""
        import argparse, json, os
        import torch
        import deepspeed
        from deepspeed import comm as dist
        p = argparse.ArgumentParser()
        p.add_argument("--local_rank", type=int)
        p.add_argument("--tag")
        a = p.parse_args()
        deepspeed.init_distributed()
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print("RESULT " + json.dumps([a.local_rank, a.tag, dist.get_rank(), dist.get_world_size(), t.item(),
                                      os.environ["LOCAL_SIZE"], dist.__name__]), flush=True)
    """))
    out = subprocess.run([sys.executable, "-m", "zero_ref.ds.launcher.runner", "--num_gpus", "2", "--master_port",
                          str(free_port()), str(script), "--tag", "x"], cwd=ROOT, capture_output=True, text=True,
                         timeout=240, env=torchrun_env(DS_ACCELERATOR="cpu"))
    # the two ranks share one stdout pipe: a line may hold both prints, so find each record, not each line
    rows = sorted(json.loads(x) for x in re.findall(r"RESULT (\[[^\]]*\])", out.stdout))
    assert out.returncode == 0, out.stderr[-3000:]
    assert rows == [[0, "x", 0, 2, 3.0, "2", "zero_ref.ds.comm"], [1, "x", 1, 2, 3.0, "2", "zero_ref.ds.comm"]]


# ---------------------------------------------------------------- the HF Trainer under both engines

TRAINER = ROOT / "tests" / "clients" / "hf_trainer.py"


def trainer(engine: str, stage: int, tmp_path: Path, *extra: str) -> dict:
    """tests/clients/hf_trainer.py on 2 CPU ranks: plain torchrun (DeepSpeed) or torchrun -m zero_ref.ds.run."""
    torchrun = Path(sys.executable).with_name("torchrun")
    run = ["-m", "zero_ref.ds.run"] if engine == "zero_ref" else PEER_RUN
    result, out_dir = tmp_path / f"{engine}.json", tmp_path / engine
    out = subprocess.run([str(torchrun), "--nproc_per_node=2", *run, str(TRAINER), "--stage", str(stage),
                          "--output_dir", str(out_dir), "--out", str(result), *extra], cwd=tmp_path,
                         capture_output=True, text=True, timeout=400, env=torchrun_env(DS_ACCELERATOR="cpu"))
    assert out.returncode == 0, f"{engine}: exit status {out.returncode}\n{out.stderr[-3000:]}"
    return {**json.loads(result.read_text()), "dir": out_dir}


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory) -> Path:
    """A tiny GPT-2 saved locally (save_pretrained), for from_pretrained; nothing downloaded."""
    import torch
    import transformers

    sys.path.insert(0, str(TRAINER.parent))
    try:
        import hf_trainer
    finally:
        sys.path.remove(str(TRAINER.parent))
    path = tmp_path_factory.mktemp("tiny-gpt2")
    torch.manual_seed(5)
    transformers.GPT2LMHeadModel(hf_trainer.gpt2_config()).save_pretrained(path)
    return path


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.parametrize("stage, build", [(2, "from_config"), (3, "from_config"), (3, "from_pretrained")])
def test_hf_trainer_gives_deepspeeds_losses(stage, build, tmp_path, request):
    extra = ["--model_name_or_path", str(request.getfixturevalue("tiny_gpt2"))] if build == "from_pretrained" else []
    saves = build == "from_config"  # the Trainer's checkpoints through each engine (ZeRO-3: weights gathered)
    if saves:
        extra += ["--save_steps", "3", *(["--gather_16bit"] if stage == 3 else [])]
    theirs = trainer("deepspeed", stage, tmp_path, *extra)
    ours = trainer("zero_ref", stage, tmp_path, *extra)
    assert theirs["engine"] == "deepspeed.runtime.engine.DeepSpeedEngine"
    assert ours["engine"] == "zero_ref.ds.engine.Engine"
    assert ours["world_size"] == theirs["world_size"] == 2
    assert len(ours["losses"]) == 6 and len(set(ours["losses"])) > 1
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6, abs=1e-5)
    if saves:
        from safetensors.torch import load_file

        for step in (3, 6):
            mine, dss = (load_file(d["dir"] / f"checkpoint-{step}" / "model.safetensors") for d in (ours, theirs))
            assert sorted(mine) == sorted(dss)
            assert max(float((mine[k] - dss[k]).abs().max()) for k in mine) <= 1e-6
            assert (ours["dir"] / f"checkpoint-{step}" / "latest").read_text().strip() == f"global_step{step}"


# ---------------------------------------------------------------- what the Trainer's accelerate calls, one rank

def test_a_scheduler_callable_gets_a_torch_optimizer_whose_rates_the_stage_steps_with(one_rank):
    """``initialize(lr_scheduler=fn)`` (the Trainer's DummyScheduler path): ``fn`` gets a torch optimizer, as
    DeepSpeed passes its basic optimizer; the weights equal torch's AdamW under the same LambdaLR."""
    import torch

    from tests.zero_ref.cases import build_model, micro_batch
    from zero_ref.ds.engine import initialize

    halve = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)  # noqa: E731
    reference = build_model()
    opt = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=0.1, weight_decay=0.0)
    sched = halve(opt)
    for step in range(3):
        reference(*micro_batch(step, 0, 0, 1, 1))[1].backward()
        opt.step()
        opt.zero_grad()
        sched.step()

    model = build_model()
    config = {"train_batch_size": 2, "gradient_clipping": 0.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.0, "torch_adam": True}}}
    engine, _, _, lr_scheduler = initialize(model=model, lr_scheduler=halve, config=config)
    assert isinstance(lr_scheduler.optimizer, torch.optim.Optimizer)
    assert lr_scheduler.optimizer.param_groups is engine.optimizer.param_groups
    seen = []
    for step in range(3):
        engine.backward(engine(*micro_batch(step, 0, 0, 1, 1))[1])
        seen.append(engine.optimizer.param_groups[0]["lr"])
        engine.step()
    assert seen == [0.1, 0.05, 0.025]
    for (name, a), b in zip(reference.named_parameters(), model.parameters()):
        assert (a - b).abs().max().item() <= 1e-6 * max(1.0, a.abs().max().item()), name


def test_a_scheduler_callable_on_a_client_optimizer_drives_the_rate(one_rank):
    import torch

    from tests.zero_ref.cases import build_model, micro_batch
    from zero_ref.ds.engine import initialize

    model = build_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    engine, *_ = initialize(model=model, optimizer=opt, config={"train_batch_size": 2},
                            lr_scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda step: 0.5 ** step))
    seen = []
    for step in range(3):
        engine.backward(engine(*micro_batch(step, 0, 0, 1, 1))[1])
        engine.step()
        seen.append(engine.optimizer.param_groups[0]["lr"])  # the rate this step used
    assert seen == [0.1, 0.05, 0.025]


def test_caller_set_accumulation_boundaries_train_as_counted_ones(one_rank):
    """accelerate's loop: ``set_gradient_accumulation_boundary`` before each backward, ``step()`` on the boundary
    only. The weights are those of a backward + step per micro-batch; a boundary off the count is refused."""
    import torch

    from tests.zero_ref.cases import build_model, micro_batch
    from zero_ref.ds.engine import initialize

    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "torch_adam": True}},
              "zero_optimization": {"stage": 2}}
    counted, told = (initialize(model=build_model(), config=config)[0] for _ in range(2))
    for step in range(3):
        for micro in range(2):
            batch = micro_batch(step, micro, 0, 1, 2)
            counted.backward(counted(*batch)[1])
            counted.step()
            told.set_gradient_accumulation_boundary(micro == 1)
            told.backward(told(*batch)[1])
            if micro == 1:
                told.step()
    assert told.global_steps == counted.global_steps == 3 and told.micro_steps == counted.micro_steps == 6
    for a, b in zip(counted.module.parameters(), told.module.parameters()):
        assert torch.equal(a, b)
    told.set_gradient_accumulation_boundary(True)
    with pytest.raises(RuntimeError, match="gradient_accumulation_steps is 2"):
        told.backward(told(*micro_batch(3, 0, 0, 1, 2))[1])


def test_the_config_accelerate_hands_over_is_read_as_deepspeed_reads_it(one_rank):
    """accelerate sets ``steps_per_print`` to inf (never print); the Trainer reads ``engine.config`` as a dict."""
    from tests.zero_ref.cases import build_model
    from zero_ref.ds.engine import initialize

    engine, *_ = initialize(model=build_model(), config={
        "train_batch_size": 2, "steps_per_print": float("inf"), "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}})
    assert engine.steps_per_print() is None
    assert engine.config.get("zero_optimization", {}).get("stage") == 1
    assert engine.config.get("tensor_parallel", {}).get("autotp_size", 0) == 0  # a key zero_ref has no section for
    assert engine.zero_gather_16bit_weights_on_model_save() is False
