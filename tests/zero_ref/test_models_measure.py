"""The course GPT and the storage-counting measurements, held against the closed-form formulas.

(a) parameter counts vs the formula; (b) model-state bytes by category after an AdamW step;
(c) the tensors autograd saves per transformer block vs Korthikanti et al. (arXiv 2205.05198),
term by term; (d) property tests that every storage is counted exactly once; (e) PeakTensorBytes
counts a new storage once, views and in-place ops not at all, and stops counting it when it is freed.
"""
import math

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_ref.measure import PeakTensorBytes, memory_by_category, saved_activation_bytes, unique_storage_bytes
from zero_ref.memory import activation_bytes_per_layer, transformer_param_count
from zero_ref.models.gpt import GPT, Block, GPTConfig, make_batch

torch.set_num_threads(1)

SHAPES = [  # (n_layers, d_model, n_heads, vocab, seq_len)
    (1, 32, 2, 64, 8),
    (2, 48, 4, 100, 16),
    (3, 64, 8, 257, 12),
]


def cfg_of(shape, **kw) -> GPTConfig:
    n_layers, d, heads, vocab, seq = shape
    return GPTConfig(vocab_size=vocab, seq_len=seq, d_model=d, n_heads=heads, n_layers=n_layers, **kw)


# ------------------------------------------------------------------ (a) the model


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_param_count_matches_formula(shape, tied, bias):
    cfg = cfg_of(shape, bias=bias, tie_embeddings=tied)
    model = GPT(cfg)
    counted = sum(p.numel() for p in model.parameters())  # a tied Parameter appears once
    L, h, V, s, f = cfg.n_layers, cfg.d_model, cfg.vocab_size, cfg.seq_len, cfg.ffn_mult * cfg.d_model
    # Written out here as well, so the test does not only trust zero_ref.memory:
    # attention 4h² (+4h), MLP 2hf (+f+h), two LayerNorms 4h; embeddings Vh + sh; final LN 2h.
    per_layer = 4 * h * h + 2 * h * f + 4 * h + ((4 * h + f + h) if bias else 0)
    by_hand = L * per_layer + V * h + s * h + 2 * h + (0 if tied else V * h)
    assert counted == cfg.num_params() == by_hand
    assert counted == transformer_param_count(L, h, V, seq_len=s, ffn_hidden=f, bias=bias, tied=tied)
    if bias and cfg.ffn_mult == 4:
        assert per_layer == 12 * h * h + 13 * h
    assert (model.head.weight is model.tok_emb.weight) == tied


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward_and_initial_loss(shape):
    cfg = cfg_of(shape)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx, targets = make_batch(cfg, batch_size=4, seed=1)
    assert torch.equal(idx[:, 1:], targets[:, :-1])          # targets are the next tokens
    assert torch.equal(make_batch(cfg, 4, seed=1)[0], idx)    # deterministic
    assert model(idx).shape == (4, cfg.seq_len, cfg.vocab_size)
    logits, loss = model(idx, targets)
    # Small init (std 0.02) makes the logits nearly uniform: loss ≈ ln(V).
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.2
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_sequence_too_long_is_a_clear_error():
    cfg = cfg_of(SHAPES[0])
    with pytest.raises(ValueError, match="seq_len"):
        GPT(cfg)(torch.zeros(1, cfg.seq_len + 1, dtype=torch.long))


# ------------------------------------------------------------------ (b) model-state bytes


def _one_adamw_step(model, cfg):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx, targets = make_batch(cfg, batch_size=2, seed=0)
    model(idx, targets)[1].backward()
    opt.step()
    return opt


@pytest.mark.parametrize("tied", [True, False])
def test_memory_by_category_fp32_adamw(tied):
    cfg = cfg_of(SHAPES[1], tie_embeddings=tied)
    model = GPT(cfg)
    psi, n_tensors = cfg.num_params(), len(list(model.parameters()))
    before = memory_by_category(model)
    assert (before.params, before.grads, before.optimizer_states, before.optimizer_other) == (4 * psi, 0, 0, 0)
    opt = _one_adamw_step(model, cfg)
    m = memory_by_category(model, opt)
    assert m.params == 4 * psi      # fp32, the tied embedding/head counted once
    assert m.grads == 4 * psi
    assert m.optimizer_states == 8 * psi  # exp_avg + exp_avg_sq: K = 8 in the ZeRO paper's terms
    # torch 2.13's AdamW keeps a 0-d fp32 `step` tensor per parameter tensor (not a Python int):
    assert {type(s["step"]) for s in opt.state.values()} == {torch.Tensor}
    assert m.optimizer_other == 4 * n_tensors
    # The only buffers: each block's additive causal mask, s×s fp32.
    assert m.buffers == cfg.n_layers * cfg.seq_len**2 * 4
    assert m.total == 16 * psi + 4 * n_tensors + m.buffers
    assert m.as_dict()["total"] == m.total


def test_memory_by_category_bf16_and_master_copies():
    cfg = cfg_of(SHAPES[1])
    model = GPT(cfg).to(torch.bfloat16)
    psi = cfg.num_params()
    m = memory_by_category(model, _one_adamw_step(model, cfg))
    assert (m.params, m.grads, m.optimizer_states) == (2 * psi, 2 * psi, 4 * psi)  # Adam states in bf16 too
    # Mixed precision by hand: the optimizer steps fp32 master copies; the model keeps bf16.
    masters = [p.detach().float().requires_grad_() for p in model.parameters()]
    for mp, p in zip(masters, model.parameters()):
        mp.grad = p.grad.float()
    opt = torch.optim.AdamW(masters)
    opt.step()
    m = memory_by_category(model, opt)
    assert m.params == 2 * psi
    assert m.grads == 2 * psi + 4 * psi            # bf16 model grads + fp32 master grads
    assert m.optimizer_states == 4 * psi + 8 * psi  # fp32 masters + two fp32 moments: K = 12


# ------------------------------------------------------------------ (c) saved activations


def block_terms(s, b, h, a, ffn=4):
    """What autograd saves for one Block, in save order, with Korthikanti's name for each term.

    bf16 activations (2 bytes), 1-byte (bool) dropout masks. Rows marked "remainder" are not in
    Korthikanti's accounting: LayerNorm also saves its per-token mean and 1/std, (b, s, 1) each.
    On CPU they have the input's dtype (bf16: 2 bytes); CUDA keeps them in fp32 (4 bytes).
    """
    sbh, as2b, sb = s * b * h, a * s * s * b, s * b
    return [
        ("LN1 input", 2 * sbh, torch.bfloat16),
        ("remainder: LN1 mean", 2 * sb, torch.bfloat16),
        ("remainder: LN1 rstd", 2 * sb, torch.bfloat16),
        ("QKV input (LN1 output)", 2 * sbh, torch.bfloat16),
        # bmm saves its second operand first: Kᵀ, then Q (and below V, then the probabilities).
        ("K (contiguous copy made by matmul)", 2 * sbh, torch.bfloat16),
        ("Q (contiguous copy made by matmul)", 2 * sbh, torch.bfloat16),
        ("softmax output", 2 * as2b, torch.bfloat16),
        ("softmax dropout mask", as2b, torch.bool),
        ("V (contiguous copy made by matmul)", 2 * sbh, torch.bfloat16),
        ("softmax dropout output", 2 * as2b, torch.bfloat16),
        ("out-projection input", 2 * sbh, torch.bfloat16),
        ("attention dropout mask", sbh, torch.bool),
        ("LN2 input", 2 * sbh, torch.bfloat16),
        ("remainder: LN2 mean", 2 * sb, torch.bfloat16),
        ("remainder: LN2 rstd", 2 * sb, torch.bfloat16),
        ("fc1 input (LN2 output)", 2 * sbh, torch.bfloat16),
        ("GeLU input", 2 * ffn * sbh, torch.bfloat16),
        ("fc2 input (GeLU output)", 2 * ffn * sbh, torch.bfloat16),
        ("MLP dropout mask", sbh, torch.bool),
    ]


ACT_SHAPES = [(16, 2, 64, 4), (24, 3, 96, 6)]  # (s, b, h, a); head dim ≠ s so no shapes coincide


def korthikanti(s, b, h, a):
    # Written out here as well as taken from zero_ref.memory: sbh(34 + 5as/h) = 34sbh + 5as²b.
    assert activation_bytes_per_layer(s, b, h, a) == 34 * s * b * h + 5 * a * s * s * b
    return 34 * s * b * h + 5 * a * s * s * b


@pytest.mark.parametrize("s,b,h,a", ACT_SHAPES)
def test_block_saved_activations_match_korthikanti(s, b, h, a):
    # A bf16 model rather than autocast: under CPU autocast LayerNorm runs in fp32 (saving a 4sbh
    # fp32 input) and the bf16 copies of the weights would be saved as non-parameter tensors.
    cfg = GPTConfig(seq_len=s, d_model=h, n_heads=a, dropout=0.1)
    block = Block(cfg).to(torch.bfloat16).train()
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)  # as from the layer below
    with saved_activation_bytes(block) as acts:
        y = block(x)
    terms = block_terms(s, b, h, a)
    assert [(i.nbytes, i.dtype) for i in acts.items] == [(n, dt) for _, n, dt in terms], acts.table()
    remainder = sum(n for name, n, _ in terms if name.startswith("remainder"))
    assert remainder == 4 * 2 * s * b                  # 2 LayerNorms × (mean, rstd) × sb × 2 bytes
    assert acts.total == korthikanti(s, b, h, a) + remainder
    y.float().sum().backward()                         # what was saved is what backward needs
    assert x.grad is not None


def test_saved_activations_whole_model():
    """Blocks add exactly one block's bytes each; what lies outside them is listed term by term."""
    s, b, h, a, V = 16, 2, 64, 4, 128
    totals = {}
    for L in (1, 2):
        cfg = GPTConfig(vocab_size=V, seq_len=s, d_model=h, n_heads=a, n_layers=L, dropout=0.1)
        model = GPT(cfg).to(torch.bfloat16).train()
        idx, targets = make_batch(cfg, b, seed=0)
        with saved_activation_bytes(model) as acts:
            model(idx, targets)
        totals[L] = acts.total
    per_block = korthikanti(s, b, h, a) + 8 * s * b
    assert totals[2] - totals[1] == per_block
    sbh = s * b * h
    outside = (
        8 * s * b        # token ids (int64), saved by the token embedding
        + 8 * s          # position ids (int64), saved by the position embedding
        + sbh            # embedding dropout mask (Korthikanti: sbh)
        + 2 * sbh        # final LayerNorm input (Korthikanti: 2sbh)
        + 2 * 2 * s * b  # its mean and rstd (bf16 on CPU)
        + 2 * sbh        # LM head input (Korthikanti: 2sbh)
        + 2 * s * b * V  # cross-entropy's log-softmax output, bf16 here (Korthikanti: 4sbV, fp32)
        + 8 * s * b      # targets (int64), saved by nll_loss
        + 2              # nll_loss's 0-d total_weight, bf16
    )
    assert totals[1] == per_block + outside


def test_saved_activations_skip_parameters_without_being_told():
    lin = nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    with saved_activation_bytes() as acts:  # the weight arrives as weight.t(), a view of a Parameter
        lin(x)
    assert acts.total == x.untyped_storage().nbytes() and len(acts.items) == 1


# ------------------------------------------------------------------ (d) each storage once

dims = st.integers(1, 6)


@settings(max_examples=25, deadline=None)
@given(shapes=st.lists(st.tuples(dims, dims), min_size=1, max_size=4),
       picks=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["whole", "t", "row", "flat", "col"])),
                      min_size=1, max_size=12),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64]))
def test_unique_storage_bytes_counts_each_storage_once(shapes, picks, dtype):
    bases = [torch.zeros(r, c, dtype=dtype) for r, c in shapes]
    views = {"whole": lambda t: t, "t": lambda t: t.t(), "row": lambda t: t[-1],
             "flat": lambda t: t.view(-1)[1:], "col": lambda t: t[:, :1]}
    used = {i % len(bases) for i, _ in picks}
    tensors = [views[v](bases[i % len(bases)]) for i, v in picks]
    expected = sum(bases[i].numel() * bases[i].element_size() for i in used)
    assert unique_storage_bytes(tensors) == expected
    assert unique_storage_bytes(tensors, exclude=[bases[i] for i in used]) == 0


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 40), k=st.integers(1, 5))
def test_saved_activations_count_a_storage_once(n, k):
    x = torch.randn(n, requires_grad=True)
    with saved_activation_bytes() as acts:
        y = x * 2
        out = sum((y * y).sum() for _ in range(k))  # each mul saves y twice; all views of y's storage
        out = out + (y[: n // 2] * y[n // 2 : 2 * (n // 2)]).sum()
    assert acts.total == y.untyped_storage().nbytes() == 4 * n
    assert len(acts.items) == 1


@settings(max_examples=25, deadline=None)
@given(n_layers=st.integers(1, 5), tie=st.lists(st.integers(0, 4), min_size=5, max_size=5), d=st.integers(1, 8))
def test_memory_by_category_counts_shared_weights_once(n_layers, tie, d):
    layers = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(n_layers))
    for i, j in enumerate(tie[:n_layers]):
        if j < i:
            layers[i].weight = layers[j].weight  # tie layer i to an earlier layer
    distinct = {id(layer.weight) for layer in layers}
    m = memory_by_category(layers)
    assert m.params == len(distinct) * d * d * 4
    assert (m.grads, m.optimizer_states, m.optimizer_other, m.buffers) == (0, 0, 0, 0)


def test_peak_tensor_bytes_counts_live_storage():
    before = torch.ones(10)                         # made outside the block: never counted
    with PeakTensorBytes() as m:
        a = torch.zeros(100, 3)                     # 1,200 bytes
        assert (m.live, m.peak) == (1200, 1200)
        v = a[10:20].view(-1).unsqueeze(0).t()      # views of a: no new storage
        a.add_(1)                                   # in place: no new storage
        before.mul_(2)
        assert (m.live, m.peak) == (1200, 1200)
        b = torch.empty(50, dtype=torch.float64)    # 400 bytes
        assert (m.live, m.peak) == (1600, 1600)
        del b                                       # freed: live falls, the peak stays
        assert (m.live, m.peak) == (1200, 1600)
        del a                                       # v still holds a's whole storage
        assert m.live == 1200
        del v
        assert m.live == 0
        c = torch.zeros(2, dtype=torch.float16)     # 4 bytes, below the peak
        assert (m.live, m.peak) == (4, 1600)
    assert c.numel() == 2
