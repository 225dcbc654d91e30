"""zero_ref.config: every malformed config gives one clear error naming its key; valid ones read as DeepSpeed would.

The corpus (tests/zero_ref/fixtures/bad_configs.json) holds wrong types, out-of-range values, unknown keys,
DeepSpeed keys zero_ref does not implement, inconsistent batches and impossible combinations. For
each: a ``ConfigError`` (a ValueError) whose ``key`` is the expected dotted path, whose message
starts with that key, is one line and says what to do — raised from zero_ref/config/reader.py itself, at
most a few frames below the call (no traceback from deep inside).
"""
import json
import os
import traceback
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from zero_ref import config as C
from zero_ref.config.batch import resolve_batch_sizes

CORPUS = json.loads((Path(__file__).parent / "fixtures" / "bad_configs.json").read_text())
CONFIG_PY = os.path.join("zero_ref", "config", "reader.py")


def test_the_corpus_is_large_and_covers_every_kind():
    assert len(CORPUS) >= 50
    keys = {c["key"] for c in CORPUS}
    assert {"train_batch_size", "zero_optimization.stage", "fp16.enabled", "optimizer.type"} <= keys


def assert_one_clear_error(config, dp, key, says, unknown_keys="warn"):
    with pytest.raises(C.ConfigError) as info:
        C.parse(config, dp=dp, unknown_keys=unknown_keys)
    e = info.value
    msg = str(e)
    assert isinstance(e, ValueError) and type(e).__module__ == "zero_ref.config.reader"
    assert e.key == key, (e.key, msg)
    assert msg.startswith(key), msg
    assert says in msg, msg
    assert "\n" not in msg and len(msg) < 600, msg
    frames = traceback.extract_tb(e.__traceback__)[1:]  # below this test's frame
    assert frames and all(f.filename.endswith(CONFIG_PY) for f in frames), [f.filename for f in frames]
    assert len(frames) <= 2, [f.name for f in frames]  # parse() raises what the reader collected
    return e


@pytest.mark.parametrize("case", CORPUS, ids=[c["name"] for c in CORPUS])
def test_each_bad_config_gives_its_one_clear_error(case):
    assert_one_clear_error(case["config"], case["dp"], case["key"], case["says"], case.get("unknown_keys", "warn"))
    assert C.problems(case["config"], dp=case["dp"])[0].key == case["key"]


@pytest.mark.parametrize("case", [c for c in CORPUS if c.get("unknown_keys")], ids=lambda c: c["name"])
def test_an_unknown_top_level_key_warns_and_is_ignored_as_in_deepspeed(case):
    """DeepSpeedConfig reads the keys it knows and never looks at the others (runtime/config.py,
    _initialize_params): by default zero_ref goes on too, with a ConfigWarning naming the key and the hint."""
    with pytest.warns(C.ConfigWarning, match=case["key"]) as seen:
        try:
            C.parse(case["config"], dp=case["dp"])
        except C.ConfigError as e:  # train_batch_sizes: then train_batch_size itself is missing
            assert e.key != case["key"]
    assert "both ignore it" in str(seen[0].message)
    assert C.problems(case["config"], dp=case["dp"], unknown_keys="warn") == [] or case["key"] == "train_batch_sizes"


def test_the_strict_opt_in_turns_the_warning_into_an_error():
    import warnings
    config = {"train_batch_size": 8, "zero_optimisation": {"stage": 3}, "my_script_setting": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error", C.ConfigWarning)
        with pytest.raises(C.ConfigWarning, match="did you mean 'zero_optimization'"):
            C.parse(config)
    with pytest.warns(C.ConfigWarning) as seen:
        assert C.parse(config).zero_optimization.stage == 0  # ignored, as DeepSpeed ignores it
    assert [str(w.message).split()[0] for w in seen] == ["zero_optimisation", "my_script_setting"]


def test_problems_lists_them_all():
    config = {"train_batch_size": 8, "zero_optimizaton": {}, "fp16": {"enabled": "yes"}, "gradient_clipping": -1}
    assert [e.key for e in C.problems(config)] == ["zero_optimizaton", "fp16.enabled", "gradient_clipping"]
    assert C.problems({"train_batch_size": 8}) == []


# ------------------------------------------------------------------ valid configs

def test_infinite_steps_per_print_is_never_in_a_dict_and_in_a_file(tmp_path):
    # what HF's Trainer and accelerate write, also into the config zero.Init reads
    (tmp_path / "ds.json").write_text('{"train_batch_size": 8, "steps_per_print": Infinity}')
    for source in ({"train_batch_size": 8, "steps_per_print": float("inf")}, tmp_path / "ds.json"):
        assert C.parse(source, dp=2).steps_per_print is None and C.problems(source) == []


def test_defaults_are_deepspeeds_code_defaults():
    cfg = C.parse({"train_batch_size": 8}, dp=2)
    assert cfg.gradient_clipping == 1.0 and cfg.steps_per_print is None and cfg.precision == "fp32"
    z = cfg.zero_optimization
    assert (z.stage, z.overlap_comm, z.stage3_prefetch_bucket_size, z.reduce_bucket_size) == (0, False, 5 * 10**7, 5 * 10**8)
    assert cfg.batch == resolve_batch_sizes(8, dp=2)
    assert C.parse({"train_batch_size": 8, "zero_optimization": {"stage": 3}}).zero_optimization.overlap_comm is True
    assert C.parse({"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": False}}) \
        .zero_optimization.overlap_comm is False


def test_deepspeed_conventions_are_followed():
    cfg = C.parse({
        "train_micro_batch_size_per_gpu": 2, "bfloat16": {"enabled": True},  # the old alias
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7, "cpu_offload": True,  # JSON floats; deprecated key
                              "allgather_bucket_size": "auto"},  # "auto" = the default
        "optimizer": {"type": "adam", "params": {"lr": 3e-4}},  # DeepSpeed lower-cases the type
        "communication_data_type": "BF16",
    }, dp=4)
    assert cfg.precision == "bf16" and cfg.batch.train_batch_size == 8
    assert cfg.zero_optimization.reduce_bucket_size == 5 * 10**7 and cfg.zero_optimization.offload_optimizer.device == "cpu"
    assert cfg.optimizer.adamw and cfg.optimizer.weight_decay == 0.0  # DeepSpeed's Adam is AdamW, decay 0
    assert C.parse({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}) \
        .optimizer.weight_decay == 0.01  # torch.optim.AdamW's default
    assert C.parse({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}).optimizer.adamw is False
    assert C.parse({"train_batch_size": 8, "zero_optimization": True}).zero_optimization.stage == 1
    assert any("cpu_offload is deprecated" in n for n in cfg.notes)


def test_keys_without_effect_are_reported_not_ignored():
    cfg = C.parse({"train_batch_size": 8, "zero_optimization": {"stage": 2, "allgather_bucket_size": 2e8,
                                                                 "stage3_max_live_parameters": 1e9},
                   "flops_profiler": {"enabled": False}})
    notes = "\n".join(cfg.notes)
    assert "allgather_bucket_size has no effect in zero_ref" in notes
    assert "stage3_max_live_parameters has no effect at stage 2" in notes
    assert "flops_profiler is not implemented in zero_ref; accepted because it is off" in notes


# the corpus's configs that DeepSpeed accepts and only zero_ref refuses (it does not implement them)
ZERO_REF_LIMITS = {"tensor parallel", "flops profiler on", "torch autocast", "Lamb",
                   "fp16 auto_cast", "prescale", "sum allreduce", "GDS", "amsgrad", "contiguous off",
                   "NVMe without a path", "params on NVMe, optimizer on CPU", "partial offload", "two NVMe paths",
                   "bf16 reduction in fp32 training", "bf16 master weights", "zenflow"}


@pytest.mark.parametrize("case", CORPUS, ids=[c["name"] for c in CORPUS])
def test_not_strict_refuses_only_what_deepspeed_refuses(case):
    """strict=False (a planner's reading): zero_ref's own limits become notes naming the key; the rest stays."""
    assert "not supported by zero_ref" not in case["says"] or case["name"] in ZERO_REF_LIMITS | {"pipeline with ZeRO-2"}
    found = C.problems(case["config"], dp=case["dp"], strict=False)
    if case["name"] == "pipeline with ZeRO-2":  # the section is DeepSpeed's; its PipelineEngine refuses ZeRO-2
        assert [e.key for e in found] == ["zero_optimization.stage"]
    elif case["name"] in ZERO_REF_LIMITS:
        assert found == []
        notes = C.parse(case["config"], dp=case["dp"], strict=False).notes
        assert any(n.startswith(case["key"]) for n in notes), notes
    else:
        assert found and found[0].key == case["key"] and case["says"] in str(found[0])


def test_not_strict_keeps_deepspeeds_values_and_rules():
    zero = {"stage": 3, "contiguous_gradients": False, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}
    cfg = C.parse({"train_batch_size": 8, "zero_optimization": zero}, strict=False)
    assert cfg.zero_optimization.contiguous_gradients is False and cfg.zero_optimization.offload_optimizer.ratio == 0.3
    with pytest.raises(C.ConfigError, match="stage 3 in DeepSpeed") as info:  # DeepSpeed's validator asserts it
        C.parse({"train_batch_size": 8, "zero_optimization": {**zero, "stage": 2}}, strict=False)
    assert info.value.key == "zero_optimization.offload_optimizer.ratio"
    no_norm = {"train_batch_size": 8, "zero_optimization": {"stage": 3, "compute_grad_norm": False}}
    with pytest.raises(C.ConfigError, match="only at stage 1 or 2"):  # DeepSpeed's validator
        C.parse(no_norm, strict=False)
    assert C.parse({**no_norm, "zero_optimization": {"stage": 2, "compute_grad_norm": False}}, strict=False)


def test_refused_precision_and_zenflow_keys_name_a_config_that_runs():
    """bf16_master_weights_and_grads, bf16_optimizer_states and zenflow: the refusal says what DeepSpeed does with
    the key and which zero_ref config is nearest; that config parses."""
    bf16 = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    base = {"train_batch_size": 8, "zero_optimization": {"stage": 2}}
    e = assert_one_clear_error({**base, "bf16": bf16}, None, "bf16.bf16_master_weights_and_grads", "2 + 8/N")
    assert "DeepSpeedCPUAdam" in str(e) and "2 + 14/N" in str(e)
    assert_one_clear_error({**base, "bf16": {**bf16, "bf16_master_weights_and_grads": False}}, None,
                           "bf16.bf16_optimizer_states", "remove both keys")
    zenflow = {"stage": 2, "offload_optimizer": {"device": "cpu"}, "zenflow": {"topk_ratio": 0.05}}
    e = assert_one_clear_error({**base, "zero_optimization": zenflow}, None, "zero_optimization.zenflow", "topk_ratio")
    assert "update_interval" in str(e)
    nearest = C.parse({**base, "bf16": {"enabled": True},
                       "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})
    assert nearest.precision == "bf16" and nearest.zero_optimization.offload_optimizer.device == "cpu"


def test_parameters_on_nvme_may_leave_their_path_to_the_optimizers():
    """zero_ref keeps one NVMe store, at offload_optimizer.nvme_path: the parameters' own path is optional."""
    zero = {"stage": 3, "offload_param": {"device": "nvme"}, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}
    assert C.problems({"train_batch_size": 8, "zero_optimization": zero}) == []


def test_files_and_encodings(tmp_path):
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 1}}))
    assert C.parse(good).zero_optimization.stage == 1 and C.parse(str(good)).train_batch_size == 8
    import base64
    assert C.parse(base64.urlsafe_b64encode(good.read_bytes()).decode()).zero_optimization.stage == 1
    dup = tmp_path / "dup.json"
    dup.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    bad = tmp_path / "bad.json"
    bad.write_text('{"train_batch_size": 8,}')
    for path, says in ((dup, "duplicate key 'train_batch_size'"), (bad, "is not valid JSON"),
                       (tmp_path / "missing.json", "is not an existing file")):
        with pytest.raises(C.ConfigError, match=says) as info:
            C.parse(path)
        assert info.value.key == "config"


def test_the_seeds_example_configs():
    """Chapter 9's verdicts: seed ch.3's 3D config is refused (twice over), seed ch.1's is valid on 1, 2, 4 or 8 ranks."""
    seed3 = {"train_batch_size": 1024, "gradient_accumulation_steps": 4,
             "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                   "allgather_partitions": True, "overlap_comm": True},
             "tensor_parallel": {"tp_size": 8}, "pipeline": {"pp_size": 4, "micro_batch_size": 8}}
    assert [e.key for e in C.problems(seed3, dp=1)] == ["tensor_parallel", "pipeline", "zero_optimization.stage"]
    seed1 = {"train_batch_size": 32, "gradient_accumulation_steps": 4, "fp16": {"enabled": True, "initial_scale_power": 12},
             "zero_optimization": {"stage": 2, "allgather_partitions": True, "reduce_scatter": True, "overlap_comm": True}}
    ok = [dp for dp in range(1, 65) if not C.problems(seed1, dp=dp)]
    assert ok == [1, 2, 4, 8]
    assert C.parse(seed1, dp=8).batch.train_micro_batch_size_per_gpu == 1


# ------------------------------------------------------------------ properties

batch_key = st.one_of(st.none(), st.integers(-2, 70))


@settings(max_examples=300, deadline=None)
@given(tbs=batch_key, mbs=batch_key, gas=batch_key, dp=st.integers(1, 16))
def test_batch_arithmetic_is_zero_ref_batchs(tbs, mbs, gas, dp):
    config = {k: v for k, v in zip(("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"),
                                   (tbs, mbs, gas)) if v is not None}
    expected = None  # a given value below 1 is refused before any arithmetic
    if all(v >= 1 for v in config.values()):
        try:
            expected = resolve_batch_sizes(tbs, mbs, gas, dp=dp)
        except ValueError:
            pass
    errors = C.problems(config, dp=dp)
    if expected is None:
        assert errors and errors[0].key in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                             "gradient_accumulation_steps"), errors
    else:
        assert not errors and C.parse(config, dp=dp).batch == expected


paths = st.sampled_from([
    ("train_batch_size",), ("gradient_clipping",), ("steps_per_print",), ("fp16", "enabled"), ("fp16", "loss_scale"),
    ("bf16", "enabled"), ("zero_optimization", "stage"), ("zero_optimization", "overlap_comm"),
    ("zero_optimization", "offload_optimizer", "device"), ("zero_optimization", "offload_param"),
    ("zero_optimization", "stage3_prefetch_bucket_size"), ("optimizer", "type"), ("optimizer", "params", "lr"),
    ("optimizer", "params", "betas"), ("scheduler", "type"), ("scheduler", "params", "total_num_steps"),
    ("aio", "block_size"), ("communication_data_type",), ("activation_checkpointing", "number_checkpoints"),
    ("checkpoint", "tag_validation"), ("zero_optimizaton",), ("bf16",), ("pipeline",),
])
values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 10**9), st.floats(allow_nan=True),
                                st.sampled_from(["auto", "cpu", "nvme", "Adam", "WarmupLR", "fp16", "x"])),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.sampled_from(["enabled", "device", "type", "lr"]),
                                                              inner, max_size=3)), max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(entries=st.lists(st.tuples(paths, values), max_size=5), dp=st.one_of(st.none(), st.integers(1, 8)))
def test_any_value_anywhere_is_read_or_refused_clearly(entries, dp):
    """Whatever a config holds, parse returns or raises ConfigError naming a key: never another exception."""
    config = {"train_batch_size": 8}
    for path, value in entries:
        node = config
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
    try:
        C.parse(config, dp=dp)
    except C.ConfigError as e:
        assert str(e).startswith(e.key) and "\n" not in str(e)


# ------------------------------------------------------------------ the table chapter 9 prints

def test_defaults_table_names_the_doc_code_disagreements():
    rows = {r["key"]: r for r in C.defaults_table()}
    assert rows["zero_optimization.stage3_prefetch_bucket_size"]["docs"] == 5 * 10**8
    assert rows["zero_optimization.overlap_comm"]["docs"] is False
    assert rows["steps_per_print"]["docs"] == 10
    assert rows["zero_optimization.offload_optimizer.device"]["docs"] == "cpu"
    assert rows["gradient_clipping"]["default"] == 1.0 and rows["gradient_clipping"]["docs"] is None
    text = C.format_defaults("zero_optimization.stage3_", disagreements_only=True)
    assert "stage3_prefetch_bucket_size" in text and "5e7" in text and "5e8" in text
