"""HuggingFace Transformers models under zero_ref (chapter 11).

A ``transformers`` model is an ``nn.Module``, and ``zero_ref.ds.initialize`` trains one at every
ZeRO stage as it is; no wrapper is needed:

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, ...))  # nothing downloaded
    engine, *_ = zero_ref.ds.initialize(model=model, config=ds_config)
    out = engine(input_ids=ids, labels=ids)     # a ModelOutput; .loss is the mean next-token cross-entropy
    engine.backward(out.loss)
    engine.step()

GPT-2's ``lm_head.weight`` *is* ``transformer.wte.weight`` (one parameter held by two modules); the
stages count it once, and under ZeRO-3 the first holder owns its unit and ``lm_head``'s hooks gather
it. A module called several times per pass (ALBERT's one shared layer) is gathered at each call.
Buffers (LLaMA's rotary ``inv_freq``) are not partitioned. What this module adds is for the two
places where transformers and DeepSpeed meet:

- ``Init``: ``zero3.Init`` for transformers models. transformers initializes weights in
  ``post_init`` through its own recursion (``smart_apply``, not ``nn.Module.apply``), after every
  submodule has been partitioned, so under plain ``Init`` it would initialize empty tensors and the
  model would keep torch's default init. This ``Init`` also gathers around each call of
  ``PreTrainedModel._initialize_weights``: the module's own parameters and its direct children's
  (GPT-2's attention re-initializes its child ``c_proj.weight``), as transformers' own ZeRO-3 path
  (``integrations.deepspeed.initialize_weights_zero3``) does. Every rank runs the init and keeps
  rank 0's result (a broadcast), so the shards hold bit for bit what ``cls(config)`` builds on rank 0
  without it.
  (transformers instead skips init while building, then inits on rank 0 and broadcasts: values
  equal in distribution, not bit for bit, to a build without DeepSpeed.)
- ``fill_auto``: the ``"auto"`` values of a DeepSpeed config filled from the Trainer's
  ``TrainingArguments``, as transformers' ``HfTrainerDeepSpeedConfig`` does, so the config a Trainer
  user already has drives ``zero_ref.ds.initialize`` too.
- ``param_count``: the parameters of a GPT-2 or LLaMA config, by formula, without building it.
"""
from __future__ import annotations

import copy
import math

from zero_ref.config import ConfigError
from zero_ref.memory import transformer_param_count
from zero_ref.stages import zero3

__all__ = ["Init", "fill_auto", "param_count"]


class Init(zero3.Init):
    """``zero3.Init`` that also gathers parameters around transformers' weight initialization."""

    def __enter__(self):
        from transformers import PreTrainedModel

        super().__enter__()
        if not self.enabled:
            return self
        self._hf_init = PreTrainedModel.__dict__["_initialize_weights"]
        original = self._hf_init

        def gathered(model, module, is_custom_code: bool = False):
            params = [*module.parameters(recurse=False),
                      *(p for child in module.children() for p in child.parameters(recurse=False))]
            units = [u for u in dict.fromkeys(map(zero3.unit_of, params))
                     if u is not None and u.full is None]
            for u in units:
                u.gather()
            original(model, module, is_custom_code)
            for u in units:
                u.take_from(0)  # rank 0's initialization on every rank (per-rank seeds draw other numbers)
                u.repartition()
                u.release()

        PreTrainedModel._initialize_weights = gathered
        return self

    def __exit__(self, *exc) -> None:
        from transformers import PreTrainedModel

        if self.enabled:
            PreTrainedModel._initialize_weights = self._hf_init
        super().__exit__(*exc)


def param_count(config) -> int:
    """Parameters of a ``GPT2Config`` or ``LlamaConfig`` model (``...LMHeadModel`` / ``...ForCausalLM``).

    GPT-2 is ``zero_ref.memory.transformer_param_count`` with learned positions and biases. LLaMA is
    its gated, RMSNorm, bias-free variant, except that grouped-query attention (``num_key_value_heads``
    < ``num_attention_heads``) shrinks the k and v projections to h × (kv_heads · head_dim) each."""
    kind = getattr(config, "model_type", None)
    tied = bool(getattr(config, "tie_word_embeddings", True))
    if kind == "gpt2":
        h = config.n_embd
        return transformer_param_count(config.n_layer, h, config.vocab_size, seq_len=config.n_positions,
                                       ffn_hidden=config.n_inner or 4 * h, tied=tied)
    if kind == "llama":
        h, f, heads = config.hidden_size, config.intermediate_size, config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or h // heads
        q, kv = heads * head_dim, (config.num_key_value_heads or heads) * head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv + h) if config.attention_bias else 0)
        mlp = 3 * h * f + ((2 * f + h) if config.mlp_bias else 0)
        per_layer = attn + mlp + 2 * h  # two RMSNorm weights
        return config.num_hidden_layers * per_layer + config.vocab_size * h + h + (0 if tied else config.vocab_size * h)
    raise ValueError(f"param_count: model_type {kind!r} is not supported (gpt2 and llama are)")


# ---------------------------------------------------------------- the Trainer's "auto" values

# (DeepSpeed key, TrainingArguments value, its name, must a given value match it?) — in transformers'
# order (HfTrainerDeepSpeedConfig.trainer_config_process).
def _process_rules(args) -> list[tuple[str, object, str, bool]]:
    return [
        ("train_micro_batch_size_per_gpu", args.per_device_train_batch_size, "per_device_train_batch_size", True),
        ("gradient_accumulation_steps", args.gradient_accumulation_steps, "gradient_accumulation_steps", True),
        ("train_batch_size", args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps,
         "train_batch_size (calculated)", True),
        ("gradient_clipping", args.max_grad_norm, "max_grad_norm", True),
        ("optimizer.params.lr", args.learning_rate, "learning_rate", True),
        ("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1+adam_beta2", True),
        ("optimizer.params.eps", args.adam_epsilon, "adam_epsilon", True),
        ("optimizer.params.weight_decay", args.weight_decay, "weight_decay", True),
        ("scheduler.params.warmup_min_lr", 0, None, False),  # not a Trainer argument
        ("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate", True),
        ("fp16.enabled", bool(args.fp16 or args.fp16_full_eval), "fp16|fp16_full_eval", True),
        ("bf16.enabled", bool(args.bf16 or args.bf16_full_eval), "bf16|bf16_full_eval", True),
    ]


def fill_auto(config: dict, args, *, hidden_size: int | None = None, num_training_steps: int | None = None) -> dict:
    """A copy of ``config`` with its ``"auto"`` values filled from ``args`` (a ``TrainingArguments``, or
    any object with its attribute names), as the HF Trainer does before calling ``deepspeed.initialize``.

    A key set to ``"auto"`` takes the argument's value; a key set to a number must equal it, else a
    ``ConfigError`` lists every mismatch (as transformers raises). With ``num_training_steps``, also
    the second pass (``trainer_config_finalize``): the scheduler's ``total_num_steps`` and
    ``warmup_num_steps``, and the bucket sizes from the model's ``hidden_size`` (h² for
    ``reduce_bucket_size``; at stage 3, 0.9·h² prefetch and 10·h persistence threshold).
    Missing sections stay missing."""
    config = copy.deepcopy(config)
    mismatches = []

    def fill(key: str, value, name: str | None, must_match: bool) -> None:
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node.get(part)
            if node is None:
                return
        if node.get(last) == "auto":
            node[last] = value
        elif must_match and node.get(last) is not None and node.get(last) != value:
            mismatches.append(f"- ds {key}={node.get(last)} vs hf {name}={value}")

    def is_auto(key: str) -> bool:
        node = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node == "auto"

    for rule in _process_rules(args):
        fill(*rule)
    if args.save_on_each_node:
        config.setdefault("checkpoint", {})["use_node_local_storage"] = True
    if num_training_steps is not None:
        sized = ["zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                 "zero_optimization.stage3_param_persistence_threshold"]
        if any(is_auto(k) for k in sized):
            if hidden_size is None:
                raise ConfigError(next(k for k in sized if is_auto(k)),
                                  f"{[k for k in sized if is_auto(k)]} are \"auto\", which is filled from the "
                                  "model's hidden_size: pass hidden_size= (or give numbers)")
            fill(sized[0], hidden_size * hidden_size, None, False)
            if config.get("zero_optimization", {}).get("stage") == 3:
                fill(sized[1], int(0.9 * hidden_size * hidden_size), None, False)
                fill(sized[2], 10 * hidden_size, None, False)
        fill("scheduler.params.total_num_steps", num_training_steps, "num_training_steps (calculated)", True)
        w = args.warmup_steps  # a count, or a fraction of the steps (TrainingArguments.get_warmup_steps)
        warmup = int(w) if w >= 1 else math.ceil(num_training_steps * w)
        fill("scheduler.params.warmup_num_steps", max(1, warmup), "warmup_steps", True)
    if mismatches:
        first = mismatches[0][len("- ds "):].split("=")[0]
        raise ConfigError(first, "these DeepSpeed config values mismatch the TrainingArguments values:\n"
                                 + "\n".join(mismatches) + "\nSet them to \"auto\" (or make them equal).")
    return config
