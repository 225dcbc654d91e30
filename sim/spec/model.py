"""What is trained: a ``Model`` (a transformer's shape) and the presets the course uses.

A plain frozen dataclass that checks its fields on construction. Every field can be overridden:
``Model.preset("gpt3-175b", seq=4096)``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from zero_ref.memory import ActivationTerms, activation_terms, transformer_param_count
from sim.spec.checks import one_of, positive_int


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer: ``layers`` blocks of width ``hidden`` over ``seq`` tokens.

    ``ffn`` is the MLP width (4·hidden when None); ``gated`` means a SwiGLU MLP (three matrices);
    ``norm`` is 'layernorm' or 'rmsnorm'; ``tied`` ties the output head to the embedding;
    ``positions`` is 'learned' (a seq × hidden table, GPT) or 'rotary' (no parameters, LLaMA);
    ``kv_heads`` is the number of key/value heads (grouped-query attention; None: ``heads``, i.e.
    multi-head attention; 1: multi-query); ``dropout`` says whether the model trains with dropout
    (GPT-3 did; LLaMA does not), which decides whether its masks are kept for backward.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    ffn: int | None = None
    gated: bool = False
    norm: str = "layernorm"
    tied: bool = True
    bias: bool = True
    positions: str = "learned"
    kv_heads: int | None = None
    dropout: bool = True

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "vocab", "seq"):
            positive_int("Model", f, getattr(self, f))
        for f in ("ffn", "kv_heads"):
            if getattr(self, f) is not None:
                positive_int("Model", f, getattr(self, f))
        if self.heads % self.key_value_heads:
            raise ValueError(f"Model.heads {self.heads} must be a multiple of Model.kv_heads {self.kv_heads}")
        one_of("Model", "norm", self.norm, ("layernorm", "rmsnorm"))
        one_of("Model", "positions", self.positions, ("learned", "rotary"))
        if self.hidden % self.heads:
            raise ValueError(f"Model.hidden {self.hidden} must be divisible by Model.heads {self.heads}")

    @property
    def ffn_hidden(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def kv_width(self) -> int:
        """Width of the k (and of the v) projection: kv_heads × head dimension."""
        return self.key_value_heads * (self.hidden // self.heads)

    @property
    def num_params(self) -> int:
        """Ψ, from zero_ref.memory.transformer_param_count (the one home of the formula)."""
        return transformer_param_count(
            self.layers, self.hidden, self.vocab, seq_len=self.seq if self.positions == "learned" else None,
            ffn_hidden=self.ffn_hidden, bias=self.bias, tied=self.tied, gated=self.gated, norm=self.norm,
            heads=self.heads, kv_heads=self.key_value_heads)

    def check_tp(self, tp: int) -> None:
        """Tensor parallelism splits whole heads and whole key/value groups: Megatron-LM asserts
        ``divide(num_query_groups, tp)`` (megatron/core/transformer/attention.py); it does not
        replicate KV heads over TP ranks (vLLM does, for inference)."""
        if self.heads % tp or self.key_value_heads % tp:
            what = f"Model.heads {self.heads}" + ("" if self.kv_heads is None else f" and Model.kv_heads {self.kv_heads}")
            raise ValueError(f"{what} must be divisible by Plan.tp {tp}")

    def activation_terms(self, batch: int, *, tp: int = 1, sp: bool = False, recompute: str = "none",
                         attention: str = "eager") -> ActivationTerms:
        """The bytes one layer keeps for backward (zero_ref.memory.activation_terms, 16-bit), by term.

        The norms' per-token statistics are left out (2 × 8 bytes per token, under 0.1 % of a layer
        at h ≥ 1024), as in Korthikanti's count, so a GPT model's total is his 34sbh + 5as²b."""
        self.check_tp(tp)
        return activation_terms(self.seq, batch, self.hidden, self.heads, kv_heads=self.key_value_heads,
                                ffn=self.ffn_hidden, mlp="swiglu" if self.gated else "gelu", norm=self.norm,
                                attention=attention, dropout=self.dropout, tp=tp, sp=sp, recompute=recompute,
                                stat_bytes=0)

    @classmethod
    def preset(cls, name: str, **overrides) -> "Model":
        key = name.lower()
        if key not in MODELS:
            raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(MODELS)}")
        return replace(MODELS[key], **overrides)

    @classmethod
    def from_hf_config(cls, config, *, seq: int | None = None, name: str | None = None) -> "Model":
        """A Model from a HuggingFace ``config.json``: a dict, or the path of the file or of its folder.

        GPT-2 keys (n_layer, n_embd, ...) or LLaMA-style ones: num_key_value_heads (GQA),
        intermediate_size, hidden_act ('silu': a SwiGLU MLP), rms_norm_eps (RMSNorm),
        tie_word_embeddings, vocab_size; dropout from attention_dropout / resid_pdrop (0: none).
        """
        if isinstance(config, (str, Path)):
            path = Path(config)
            path = path / "config.json" if path.is_dir() else path
            if not path.is_file():
                raise ValueError(f"no HF config at {path}")
            config = json.loads(path.read_text())
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict or a path, got {type(config).__name__}")

        def get(*keys, default=None):
            for k in keys:
                if config.get(k) is not None:
                    return config[k]
            if default is None:
                raise ValueError(f"HF config needs one of {', '.join(keys)}")
            return default

        llama_like = config.get("model_type") in ("llama", "mistral", "qwen2") or "rms_norm_eps" in config
        layers, hidden = get("num_hidden_layers", "n_layer"), get("hidden_size", "n_embd")
        heads = get("num_attention_heads", "n_head")
        drop = max(float(config.get(k) or 0.0) for k in ("attention_dropout", "hidden_dropout", "resid_pdrop",
                                                         "attn_pdrop", "dropout"))
        has_drop_key = any(k in config for k in ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop",
                                                 "dropout"))
        return cls(
            name=name or config.get("_name_or_path") or config.get("model_type") or "hf-model",
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or None,
            dropout=drop > 0 if has_drop_key else not llama_like,  # GPT-2's config defaults to 0.1
            vocab=get("vocab_size"),
            seq=seq or get("max_position_embeddings", "n_positions", "n_ctx"),
            ffn=config.get("intermediate_size") or config.get("n_inner"),
            gated=config.get("hidden_act", config.get("activation_function")) in ("silu", "swiglu") or llama_like,
            norm="rmsnorm" if llama_like else "layernorm",
            tied=bool(config.get("tie_word_embeddings", not llama_like)),
            bias=bool(config.get("attention_bias", config.get("bias", not llama_like))),
            positions="rotary" if llama_like or "rope_theta" in config else "learned",
        )


def _gpt(name, layers, hidden, heads, seq=2048, vocab=50257):
    return Model(name, layers, hidden, heads, vocab, seq)


def _llama(name, layers, hidden, heads, ffn, *, seq=2048, vocab=32000, kv_heads=None, dropout=True):
    return Model(name, layers, hidden, heads, vocab, seq, ffn=ffn, gated=True, norm="rmsnorm",
                 tied=False, bias=False, positions="rotary", kv_heads=kv_heads, dropout=dropout)


# GPT-3 (Brown et al. 2020, Table 2.1). The table's XL (24 heads × 128 ≠ 2048) and 13B (d_model
# 5140) rows do not multiply out; we keep d_head = 128 and d_model = 5120 (as Megatron does).
MODELS = {m.name: m for m in (
    _gpt("gpt3-125m", 12, 768, 12), _gpt("gpt3-350m", 24, 1024, 16), _gpt("gpt3-760m", 24, 1536, 16),
    _gpt("gpt3-1.3b", 24, 2048, 16), _gpt("gpt3-2.7b", 32, 2560, 32), _gpt("gpt3-6.7b", 32, 4096, 32),
    _gpt("gpt3-13b", 40, 5120, 40), _gpt("gpt3-175b", 96, 12288, 96),
    _gpt("gpt2-1.5b", 48, 1600, 25, seq=1024),
    _llama("llama-7b", 32, 4096, 32, 11008), _llama("llama-13b", 40, 5120, 40, 13824),
    _llama("llama-33b", 60, 6656, 52, 17920), _llama("llama-65b", 80, 8192, 64, 22016),
    # Llama 2 and 3 (the HF config.json of meta-llama/Llama-2-*-hf and Meta-Llama-3-*): no dropout,
    # grouped-query attention with 8 key/value heads for Llama-2-70B and Llama 3.
    _llama("llama-2-7b", 32, 4096, 32, 11008, seq=4096, dropout=False),
    _llama("llama-2-13b", 40, 5120, 40, 13824, seq=4096, dropout=False),
    _llama("llama-2-70b", 80, 8192, 64, 28672, seq=4096, kv_heads=8, dropout=False),
    _llama("llama-3-8b", 32, 4096, 32, 14336, seq=8192, vocab=128256, kv_heads=8, dropout=False),
    _llama("llama-3-70b", 80, 8192, 64, 28672, seq=8192, vocab=128256, kv_heads=8, dropout=False),
)}
