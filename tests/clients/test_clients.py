"""The DeepSpeed scripts of this folder on 2 CPU ranks, each run twice: by torchrun with only zero_ref's exit wait
(DeepSpeed 0.19.8; tests/helpers.py, PEER_RUN) and by ``torchrun -m zero_ref.ds.run`` (zero_ref, the script
unedited). Every number a script reports agrees: fp32 to 1e-6 relative, bf16 within one bf16 ulp of DeepSpeed's
value; a resumed run (a fresh process loading the first run's checkpoint) reports what DeepSpeed's resumed run
reports; both runs exit with status 0."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PEER_RUN, ROOT, torchrun_env

HERE = Path(__file__).parent

FP32_ADAM = {"gradient_clipping": 0.0, "steps_per_print": 1000}
CONFIGS = {
    "cifar": {**FP32_ADAM, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
              "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                           "warmup_num_steps": 4}},
              "zero_optimization": {"stage": 1}},
    "pipeline": {**FP32_ADAM, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 8,
                 "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
                 "zero_optimization": {"stage": 1}},
    "sgd": {**FP32_ADAM, "train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2},
            "zero_allow_untested_optimizer": True},
}

# id: (script, its arguments, the arguments of a resumed run or None, bf16?); {cfg} is the config file, {ckpt}
# the run's checkpoint directory
RUNS = {
    "cifar-zero1": ("cifar.py", ["--deepspeed", "--deepspeed_config", "{cfg:cifar}"], None, False),
    "pipeline-p2": ("pipeline.py", ["-p", "2", "--deepspeed_config", "{cfg:pipeline}"], None, False),
    "pipeline-p0": ("pipeline.py", ["-p", "0", "--deepspeed_config", "{cfg:pipeline}"], None, False),
    "bert-zero3-bf16": ("bert.py", ["--checkpoint_dir", "{ckpt}"], ["--load_checkpoint_dir", "{ckpt}"], True),
    "gpt2-chat-zero3": ("gpt2_chat.py", [], None, False),
    "gpt2-chat-zero2": ("gpt2_chat.py", ["--zero_stage", "2"], None, False),
    "nanogpt-zero2": ("nanogpt.py", ["--out_dir", "{ckpt}"], ["--out_dir", "{ckpt}", "--init_from", "resume"], False),
    "imagenet-sgd-zero2": ("imagenet_sgd.py", ["--deepspeed_config", "{cfg:sgd}"], None, False),
}


def run(script: str, args: list[str], engine: str, tmp_path: Path) -> dict:
    """Rank 0's RESULT of ``script`` under ``engine``, after asserting both ranks exited with status 0."""
    ckpt = tmp_path / f"ckpt-{engine}"
    for name, cfg in CONFIGS.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
    args = [a.replace("{ckpt}", str(ckpt)) for a in args]
    args = [str(tmp_path / f"{a[5:-1]}.json") if a.startswith("{cfg:") else a for a in args]
    launch = ["-m", "zero_ref.ds.run"] if engine == "zero_ref" else PEER_RUN
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--nproc_per_node=2", *launch, str(HERE / script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=400, env=torchrun_env(DS_ACCELERATOR="cpu"))
    assert out.returncode == 0, f"{script} on {engine} exited with {out.returncode}:\n{out.stderr[-3000:]}"
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1, f"{script} on {engine}: no RESULT line\n{out.stdout[-2000:]}"
    result = json.loads(lines[0][len("RESULT "):])
    ran = result.pop("engine")
    assert ran.startswith("zero_ref.ds." if engine == "zero_ref" else "deepspeed."), (engine, ran)
    return result


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at ``x`` (8 significant bits)."""
    return 2.0 ** (math.frexp(x)[1] - 8) if x else 2.0 ** -133


def agree(ours, theirs, bf16: bool, where: str = "") -> list[str]:
    """Where two RESULTs differ: floats beyond the tolerance, anything else not equal."""
    if isinstance(theirs, dict):
        if set(ours) != set(theirs):
            return [f"{where}: keys {sorted(ours)} vs {sorted(theirs)}"]
        return [d for k in theirs for d in agree(ours[k], theirs[k], bf16, f"{where}.{k}" if where else k)]
    if isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{where}: {len(ours)} values vs {len(theirs)}"]
        return [d for i, (a, b) in enumerate(zip(ours, theirs)) for d in agree(a, b, bf16, f"{where}[{i}]")]
    if isinstance(theirs, float):
        close = abs(ours - theirs) <= (bf16_ulp(theirs) if bf16 else 1e-6 * abs(theirs))
        return [] if close else [f"{where}: zero_ref {ours!r}, DeepSpeed {theirs!r}"]
    return [] if ours == theirs else [f"{where}: zero_ref {ours!r}, DeepSpeed {theirs!r}"]


def test_bf16_ulp():
    assert bf16_ulp(1.0) == 2 ** -7 and bf16_ulp(4.5) == 2 ** -5 and bf16_ulp(0.75) == 2 ** -8


def test_agree_names_each_difference():
    assert agree({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 * (1 + 2e-6)]}, False) == ["a[1]: zero_ref 2.0, DeepSpeed 2.000004"]
    assert agree([4.5], [4.5 + 2 ** -5], True) == [] and agree([4.5], [4.5 + 2 ** -4], True)


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", list(RUNS))
def test_script_gives_deepspeeds_numbers(name, tmp_path):
    script, args, resume_args, bf16 = RUNS[name]
    results = {}
    for engine in ("zero_ref", "deepspeed"):
        results[engine] = {"run": run(script, args, engine, tmp_path)}
        if resume_args is not None:
            results[engine]["resumed"] = run(script, resume_args, engine, tmp_path)
    ours, theirs = results["zero_ref"], results["deepspeed"]
    differ = agree(ours, theirs, bf16)
    assert not differ, f"{name}: zero_ref and DeepSpeed differ at\n" + "\n".join(differ)
    if name == "cifar-zero1":  # data fixed by the sampler, no dropout: the replayed epoch is the second epoch again
        run1 = ours["run"]
        assert run1["resumed"] == pytest.approx(run1["losses"][len(run1["resumed"]):], rel=1e-6)
        assert run1["client_state"] == {"epoch": 0, "accuracy": run1["accuracy"][0]}
    if resume_args is not None:  # the resumed run went on from the checkpoint's step
        first = ours["resumed"].get("steps", ours["resumed"].get("iters"))[0]
        assert first == {"bert-zero3-bf16": 5, "nanogpt-zero2": 4}[name]
