"""What the simulator simulates: a ``Model``, a ``GPU`` and a ``Cluster`` of them (a ``Plan`` lives in sim.plan).

Plain frozen dataclasses that check their fields on construction, with presets for the models and
machines the course uses. Every field can be overridden: ``Model.preset("gpt3-175b", seq=4096)``,
``Cluster.preset("A100-80GB", nodes=128, ib_bw=400e9)``. Bandwidths are bytes/s, one direction.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from zero_ref.memory import ActivationTerms, GiB, activation_terms, transformer_param_count


def positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


def positive_number(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")


def one_of(owner: str, name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


# ---------------------------------------------------------------- models


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


# ---------------------------------------------------------------- hardware


@dataclass(frozen=True)
class GPU:
    """One accelerator: dense 16-bit peak FLOP/s, HBM capacity (bytes) and bandwidth (bytes/s)."""

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bw: float
    bf16: bool = True

    def __post_init__(self):
        for f in ("peak_flops", "hbm_bytes", "hbm_bw"):
            positive_number("GPU", f, getattr(self, f))

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPU":
        if name not in GPUS:
            raise ValueError(f"unknown GPU preset {name!r}; choose one of: {', '.join(GPUS)}")
        return replace(GPUS[name], **overrides)


GPUS = {g.name: g for g in (
    GPU("V100-32GB", 125e12, 32 * GiB, 900e9, bf16=False),   # fp16 tensor cores; no bf16
    GPU("A100-40GB", 312e12, 40 * GiB, 1555e9),
    GPU("A100-80GB", 312e12, 80 * GiB, 2039e9),
    GPU("H100-80GB", 989e12, 80 * GiB, 3350e9),               # SXM
    GPU("H200-141GB", 989e12, 141e9, 4800e9),
)}


@dataclass(frozen=True)
class Cluster:
    """``nodes`` × ``gpus_per_node`` GPUs and the links between them (bytes/s, one direction).

    ``nvlink_bw`` per GPU inside a node (NVLink/NVSwitch); ``pcie_bw`` per GPU to its host;
    ``ib_bw`` per node across nodes (all its NICs together: each GPU's share is ib_bw/gpus_per_node);
    ``nvme_read_bw``/``nvme_write_bw`` per node; ``cpu_bytes`` host memory and ``nvme_bytes`` per node.
    """

    gpu: GPU
    nodes: int = 1
    gpus_per_node: int = 8
    nvlink_bw: float = 300e9
    pcie_bw: float = 32e9
    ib_bw: float = 200e9
    nvme_read_bw: float = 25e9
    nvme_write_bw: float = 20e9
    cpu_bytes: float = 1024 * GiB
    nvme_bytes: float = 15e12

    def __post_init__(self):
        if not isinstance(self.gpu, GPU):
            raise ValueError(f"Cluster.gpu must be a GPU, got {self.gpu!r}")
        positive_int("Cluster", "nodes", self.nodes)
        positive_int("Cluster", "gpus_per_node", self.gpus_per_node)
        for f in ("nvlink_bw", "pcie_bw", "ib_bw", "nvme_read_bw", "nvme_write_bw", "cpu_bytes", "nvme_bytes"):
            positive_number("Cluster", f, getattr(self, f))

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def ib_bw_per_gpu(self) -> float:
        return self.ib_bw / self.gpus_per_node

    @classmethod
    def preset(cls, gpu: str, nodes: int = 1, **overrides) -> "Cluster":
        """A DGX-like node of ``gpu`` (see NODES), ``nodes`` of them; any field can be overridden."""
        if gpu not in NODES:
            raise ValueError(f"unknown cluster preset {gpu!r}; choose one of: {', '.join(NODES)}")
        gpu_overrides = {k: overrides.pop(k) for k in ("peak_flops", "hbm_bytes", "hbm_bw") if k in overrides}
        return cls(GPU.preset(gpu, **gpu_overrides), nodes=nodes, **{**NODES[gpu], **overrides})


# Per-node defaults in the style of the vendor's reference node: DGX-1 (V100: 4×100 Gb/s IB, PCIe 3),
# DGX A100 (8×200 Gb/s HDR, PCIe 4), DGX H100/H200 (8×400 Gb/s NDR, PCIe 5). NVLink: per GPU, one
# direction (V100 NVLink2 150 GB/s, A100 NVLink3 300 GB/s, H100/H200 NVLink4 450 GB/s).
NODES = {
    "V100-32GB": dict(nvlink_bw=150e9, pcie_bw=16e9, ib_bw=50e9, cpu_bytes=512 * GiB),
    "A100-40GB": dict(nvlink_bw=300e9, pcie_bw=32e9, ib_bw=200e9, cpu_bytes=1024 * GiB),
    "A100-80GB": dict(nvlink_bw=300e9, pcie_bw=32e9, ib_bw=200e9, cpu_bytes=2048 * GiB),
    "H100-80GB": dict(nvlink_bw=450e9, pcie_bw=64e9, ib_bw=400e9, cpu_bytes=2048 * GiB),
    "H200-141GB": dict(nvlink_bw=450e9, pcie_bw=64e9, ib_bw=400e9, cpu_bytes=2048 * GiB),
}
