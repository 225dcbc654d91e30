"""``python -m sim plan``: ranked plans that fit, a DeepSpeed config zero_ref.config accepts, clear errors."""
import json
import os
import subprocess
import sys

import pytest

from sim.planning import cli
from sim.spec.plan import Plan
from zero_ref import config as ds_config


def test_plan_prints_plans_that_fit_and_writes_a_config_deepspeed_reads(tmp_path, capsys):
    out = tmp_path / "ds.json"
    assert cli.main(["plan", "--model", "llama-2-7b", "--gpus", "16", "--gpu", "H100-80GB", "--seq", "4096",
                     "--global-batch", "256", "--top", "3", "--write-config", str(out)]) == 0
    text = capsys.readouterr().out
    assert "llama-2-7b" in text and "16 × H100-80GB" in text and "global batch 256" in text
    rows = [line for line in text.splitlines() if line[:2].strip().isdigit()]
    assert len(rows) == 3
    raw = json.loads(out.read_text())
    result, best = cli.plan(cli.load_model("llama-2-7b", 4096), "H100-80GB", 16, 256, top=3)
    chosen = best[0][0].plan
    assert best[0][1].peak_gpu_bytes <= result.memory_limit
    assert [r.step_time for r, _ in best] == sorted(r.step_time for r, _ in best)
    cfg = ds_config.parse(raw, dp=chosen.dp)  # strict: every key is one zero_ref (and DeepSpeed) reads
    assert cfg.batch.train_batch_size == 256 and cfg.zero_optimization.stage == chosen.zero_stage
    back = Plan.from_deepspeed(raw, chosen.world_size, chosen.tp, chosen.pp, recompute=chosen.recompute,
                               sequence_parallel=chosen.sequence_parallel, schedule=chosen.schedule,
                               virtual=chosen.virtual, attention=chosen.attention)
    assert back == chosen
    assert chosen.attention == "flash" and not (chosen.pp > 1 and chosen.zero_stage > 1)


def test_model_from_a_hf_config_path(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 1376, "vocab_size": 32000, "max_position_embeddings": 1024,
           "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_dropout": 0.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = cli.load_model(str(tmp_path), None)
    assert (m.kv_heads, m.seq, m.dropout) == (2, 1024, False)


@pytest.mark.parametrize("args,message", [
    (["--model", "gpt3-125m", "--gpus", "64", "--global-batch", "6"], "--global-batch 6: global_batch 6 does not split"),
    (["--model", "llama-3-8b", "--gpus", "12"], "--gpus: 12 GPUs: above 8 they must fill whole 8-GPU nodes"),
    (["--model", "llama-3-8b", "--gpus", "8", "--gpu", "TPU"], "--gpu 'TPU' is not a GPU preset"),
    (["--model", "llama-9", "--gpus", "8"], "--model 'llama-9' is neither a preset"),
    (["--model", "gpt3-175b", "--gpus", "1", "--gpu", "V100-32GB", "--seq", "2048", "--global-batch", "1"],
     "--model gpt3-175b: 174.6 B parameters need 2.8 TB"),
])
def test_impossible_requests_are_one_line_errors(args, message, capsys, monkeypatch):
    if "gpt3-175b" in args:  # shrink the node's host memory and NVMe so that the states cannot fit anywhere
        import sim.planning.advice
        orig = sim.planning.advice.cluster_of
        monkeypatch.setattr(cli.advice, "cluster_of", lambda g, n: orig(g, n, cpu_bytes=512 * 2**30, nvme_bytes=1e12))
    assert cli.main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_python_dash_m_sim_runs_the_planner():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-m", "sim", "plan", "--model", "gpt3-125m", "--gpus", "64",
                        "--global-batch", "6"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: --global-batch 6") and r.stdout == ""


def test_a_long_sequence_plan_splits_the_sequence(capsys):
    # Llama-3-8B at 32k tokens on 16 H100s: the fastest plan uses Ulysses; cp is printed, not written
    assert cli.main(["plan", "--model", "llama-3-8b", "--gpus", "16", "--seq", "32768", "--global-batch", "32",
                     "--top", "2"]) == 0
    text = capsys.readouterr().out
    first = next(line for line in text.splitlines() if line.startswith(" 1 "))
    assert " cp4u " in first and "cp=4 (ulysses)" in text
def test_framework_option_plans_with_that_frameworks_collectives(capsys):
    assert cli.main(["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--top", "2", "--framework", "fsdp2"]) == 0
    out = capsys.readouterr().out
    assert "fsdp2 settings" in out and "reshard_after_forward=" in out
    assert all(" Z3 " in line and "fsdp2" in line for line in out.splitlines() if line[:2].strip().isdigit())
    assert cli.main(["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--framework", "megatron",
                     "--write-config", "x.json"]) == 2
    assert "--write-config writes a DeepSpeed config" in capsys.readouterr().err
