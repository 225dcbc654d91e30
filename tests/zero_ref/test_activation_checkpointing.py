"""Activation checkpointing (zero_ref.activation_checkpointing) against the plain model and DeepSpeed's own.

- Exactness: a GPT with every block checkpointed, dropout 0.1, gives the *same bits* of loss and
  every gradient as the plain model (the recompute restores the RNG state, so the masks repeat);
  so do CPU checkpointing, partitioned activations over 2 tp ranks, and DeepSpeed 0.19.8's
  ``deepspeed.checkpointing.checkpoint`` run on the same blocks (DS_ACCELERATOR=cpu).
- Memory: the bytes autograd keeps (zero_ref.measure) fall from Korthikanti's 34sbh + 5as²b per
  layer (+ LayerNorm statistics) to the block input, 2sbh in bf16 / 4sbh in fp32 — to the byte;
  partitioned over t ranks, each rank keeps 1/t of it; all-gathered bytes = the full inputs.
- Cost: FLOPs counted by torch's FlopCounterMode: the checkpointed step costs exactly one more
  forward of the checkpointed blocks; each block's forward runs twice.
- Bad input: clear errors.
"""
import os
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.flop_counter import FlopCounterMode

import zero_ref
from zero_ref import activation_checkpointing as ck
from zero_ref.measure import saved_activation_bytes
from zero_ref.memory import activation_bytes_per_layer
from zero_ref.models import GPT, GPTConfig, make_batch

S, B, H, A, V, L = 16, 2, 32, 4, 64, 3


@pytest.fixture(autouse=True)
def defaults():
    ck.configure()  # every test starts from DeepSpeed's defaults (nothing partitioned, nothing on the host)
    yield
    ck.configure()


def tiny(layers=L, dropout=0.1, dtype=torch.float32):
    cfg = GPTConfig(vocab_size=V, seq_len=S, d_model=H, n_heads=A, n_layers=layers, dropout=dropout)
    torch.manual_seed(0)
    return GPT(cfg).to(dtype).train(), make_batch(cfg, B, seed=3)


def loss_and_grads(model, batch, seed=7):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the dropout masks of this step
    loss = model(*batch)[1]
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def assert_same_bits(a, b):
    (la, ga), (lb, gb) = a, b
    assert torch.equal(la, lb), (la.item(), lb.item())
    assert len(ga) == len(gb) and all(torch.equal(x, y) for x, y in zip(ga, gb))


@pytest.mark.parametrize("cpu", [False, True])
def test_checkpointed_gpt_is_bit_identical_with_dropout(cpu):
    model, batch = tiny()
    plain = loss_and_grads(model, batch)
    ck.configure(checkpoint_in_cpu=cpu)
    assert ck.checkpoint_layers(model.blocks) == L
    assert_same_bits(loss_and_grads(model, batch), plain)
    st_ = ck.stats()
    assert (st_.checkpoints, st_.recomputes) == (L, L)
    tier = "host" if cpu else "device"
    assert st_.saved_bytes == {"device": 0, "host": 0, tier: L * 4 * S * B * H}
    ck.checkpoint_layers(model.blocks, 0)  # undone: the plain forward again
    ck.reset()
    assert_same_bits(loss_and_grads(model, batch), plain)
    assert ck.stats().checkpoints == 0


def test_dropout_masks_differ_without_the_rng_restore(monkeypatch):
    """The control: with the RNG state not restored, the recompute draws new masks and the gradients change."""
    model, batch = tiny()
    plain = loss_and_grads(model, batch)
    ck.checkpoint_layers(model.blocks)
    monkeypatch.setattr(ck.rng, "restore", lambda state: None)
    changed = loss_and_grads(model, batch)
    assert torch.equal(changed[0], plain[0])               # the forward is the same
    assert not all(torch.equal(x, y) for x, y in zip(changed[1], plain[1]))


@pytest.mark.parametrize("dtype,width", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_saved_bytes_fall_to_the_block_inputs(dtype, width):
    model, _ = tiny(dtype=dtype)
    sbh = S * B * H
    x0 = torch.randn(B, S, H, dtype=dtype, requires_grad=True)

    def saved(count):
        ck.checkpoint_layers(model.blocks, count)
        with saved_activation_bytes(model) as acts:
            x = x0
            for block in model.blocks:
                x = block(x)
        x.float().sum().backward()
        return acts.total

    per_block = saved(0) // L
    assert saved(L) == L * width * sbh
    if dtype == torch.bfloat16:  # Korthikanti counts 16-bit tensors; LayerNorm's mean and rstd are extra
        assert per_block == activation_bytes_per_layer(S, B, H, A) + 4 * 2 * S * B
        assert saved(L) == L * activation_bytes_per_layer(S, B, H, A, recompute="full")
    for k in range(L + 1):  # the first k blocks checkpointed
        assert saved(k) == k * width * sbh + (L - k) * per_block


def test_whole_gpt_saves_one_input_per_block():
    totals = {}
    for layers in (1, 2):
        model, batch = tiny(layers=layers, dtype=torch.bfloat16)
        ck.checkpoint_layers(model.blocks)
        with saved_activation_bytes(model) as acts:
            model(*batch)
        totals[layers] = acts.total
    assert totals[2] - totals[1] == 2 * S * B * H


def test_recompute_costs_one_more_forward_of_the_blocks():
    model, batch = tiny()
    calls = []
    for block in model.blocks:  # (the recompute calls the block's forward itself, so hook a sub-module)
        block.attn.register_forward_pre_hook(lambda m, a: calls.append(m))

    def step_flops():
        calls.clear()
        with FlopCounterMode(display=False) as fc:
            model(*batch)[1].backward()
        return fc.get_total_flops(), len(calls)

    plain, plain_calls = step_flops()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        x = torch.randn(B, S, H)
        for block in model.blocks:
            x = block(x)
    blocks_forward = fc.get_total_flops()
    assert blocks_forward == L * (24 * B * S * H * H + 4 * B * S * S * H)  # 2mnk per matmul: 24bsh² + 4bs²h
    ck.checkpoint_layers(model.blocks)
    ckpt, ckpt_calls = step_flops()
    assert ckpt - plain == blocks_forward
    assert (plain_calls, ckpt_calls) == (L, 2 * L)


def test_rng_tracker_streams_are_restored_too():
    """Dropout drawn from the tracker's model-parallel stream (DeepSpeed's fork()) repeats as well."""
    ck.model_parallel_cuda_manual_seed(1234)
    tracker = ck.get_cuda_rng_tracker()
    w = torch.randn(H, H, requires_grad=True)

    def f(x):
        with tracker.fork():
            x = torch.nn.functional.dropout(x @ w, 0.5)
        return torch.nn.functional.dropout(x, 0.3).tanh()

    x = torch.randn(8, H, requires_grad=True)
    grads = []
    for run in (f, lambda x: ck.checkpoint(f, x)):
        ck.model_parallel_cuda_manual_seed(1234)
        run(x).sum().backward()
        grads.append((x.grad.clone(), w.grad.clone()))
        x.grad = w.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    with pytest.raises(ValueError, match="already exists"):
        tracker.add("model-parallel-rng", 1)
    with pytest.raises(KeyError, match="no state 'other'"):
        with tracker.fork("other"):
            pass


@settings(max_examples=25, deadline=None)
@given(n_in=st.integers(1, 3), n_out=st.integers(1, 3), rows=st.integers(1, 5), scale=st.floats(0.5, 2.0),
       seed=st.integers(0, 10**6))
def test_any_function_of_tensors_gets_the_plain_gradients(n_in, n_out, rows, scale, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(rows, 4, generator=g, requires_grad=True) for _ in range(n_in)]
    w = torch.randn(4, 4, generator=g, requires_grad=True)
    idx = torch.arange(rows) % 2  # an integer input, kept whole

    def f(*inputs, scale, idx):
        h = sum(torch.sin(x @ w) for x in inputs) * scale + idx[:, None]
        outs = tuple(h ** (k + 1) for k in range(n_out))
        return outs if n_out > 1 else outs[0]

    grads = []
    for run in (f, lambda *a, **k: ck.checkpoint(f, *a, **k)):
        out = run(*xs, scale=scale, idx=idx)
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.sum() for o in outs).backward()
        grads.append([t.grad.clone() for t in (*xs, w)])
        for t in (*xs, w):
            t.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_no_grad_runs_plainly_and_counts_nothing():
    model, batch = tiny()
    ck.checkpoint_layers(model.blocks)
    with torch.no_grad():
        model(*batch)
    assert ck.stats().checkpoints == 0


def test_clear_errors():
    with pytest.raises(ValueError, match="partition_activations=True needs the tensor-parallel group"):
        ck.configure(partition_activations=True)
    with pytest.raises(ValueError, match="works only with partition_activations"):
        ck.configure(contiguous_checkpointing=True)
    with pytest.raises(ValueError, match="num_checkpoints must be a positive integer, got 0"):
        ck.configure(num_checkpoints=0)
    with pytest.raises(TypeError, match="mpu_ must be zero_ref's ParallelGroups.*got str"):
        ck.configure("tp")
    with pytest.raises(TypeError, match="function must be callable, got int"):
        ck.checkpoint(3, torch.ones(1))
    x = torch.ones(2, requires_grad=True)
    for bad in (lambda x: {"y": x}, lambda x: None, lambda x: (x, 2), lambda x: ()):
        with pytest.raises(TypeError, match="must return a tensor or a non-empty tuple of tensors"):
            ck.checkpoint(bad, x)
    with pytest.warns(UserWarning, match="no input requires grad"):
        ck.checkpoint(torch.nn.Linear(2, 2), torch.ones(2))
    y = ck.checkpoint(torch.sin, x)
    with pytest.raises(RuntimeError, match=r"needs .backward\(\); torch.autograd.grad"):
        torch.autograd.grad(y.sum(), x)
    with pytest.raises(ValueError, match=r"count must be an integer in \[0, 3\], got 4"):
        ck.checkpoint_layers(tiny()[0].blocks, 4)


def test_config_section_problems_name_their_key():
    from zero_ref.config import ConfigError, parse
    for section, key in [({"contiguous_memory_optimization": True}, "contiguous_memory_optimization"),
                         ({"partition_activations": True, "contiguous_memory_optimization": True},
                          "number_checkpoints")]:
        cfg = parse({"train_batch_size": 1, "activation_checkpointing": section})
        with pytest.raises(ConfigError, match=f"activation_checkpointing.{key}") as e:
            ck.configure_from_config(cfg)
        assert e.value.key == f"activation_checkpointing.{key}"
    assert ck.configure_from_config(parse({"train_batch_size": 1, "activation_checkpointing": {}})) == []
    notes = ck.configure_from_config(parse({"train_batch_size": 1, "activation_checkpointing": {
        "cpu_checkpointing": True, "profile": True}}))
    assert notes == [] and ck.settings()["checkpoint_in_cpu"] and ck.settings()["profile"]


# ---------------------------------------------------------------- two real tp ranks (gloo), and DeepSpeed


def two_ranks(rank, world):
    os.environ["DS_ACCELERATOR"] = "cpu"
    import torch
    import torch.distributed as dist

    from zero_ref import activation_checkpointing as ck, comm
    from zero_ref.config import parse
    from zero_ref.ds.engine import initialize
    from zero_ref.measure import saved_activation_bytes
    from zero_ref.models import GPT, GPTConfig, make_batch
    from zero_ref.parallel.groups import build_groups
    from zero_ref.parallel.tensor import TensorParallelGPT
    from zero_ref.parallel.topology import Topology

    out = {}
    cfg = GPTConfig(vocab_size=V, seq_len=S, d_model=H, n_heads=A, n_layers=L, dropout=0.1)
    torch.manual_seed(0)
    model = TensorParallelGPT(GPT(cfg), dist.group.WORLD).train()
    batch = make_batch(cfg, B, seed=3)

    # The engine reads the activation_checkpointing section (before any mpu is known: a note).
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": True,
                                           "number_checkpoints": L}}
    out["engine_notes"] = ck.configure_from_config(parse(config))
    initialize(model=GPT(cfg), config=config)
    out["engine_settings"] = ck.settings()
    groups = build_groups(Topology.for_world(world, tp=2), axes=("tp",))

    def step(mode):
        """Loss, gradients, saved bytes of the blocks, bytes kept by tier, collectives in backward."""
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        x0 = model.embed(batch[0])
        with saved_activation_bytes(model) as acts:
            x = x0
            for block in model.blocks:
                x = block(x)
        loss = model.head_loss(x, batch[1])[1]
        with comm.recording() as log:
            loss.backward()
        kept = dict(ck.stats().saved_bytes)
        return (loss.detach(), [p.grad.clone() for p in model.parameters()], acts.total, kept, log.by_op())

    def ds_mode(partition):
        import deepspeed
        from deepspeed import checkpointing as dsck
        deepspeed.init_distributed("gloo")
        dsck.configure(MPU(), partition_activations=partition)
        for block in model.blocks:
            block.__dict__.pop("forward", None)
            block.forward = (lambda f: lambda x: dsck.checkpoint(f, x))(block.forward)
        try:
            return step(f"deepspeed partition={partition}")
        finally:
            for block in model.blocks:
                block.__dict__.pop("forward", None)

    class MPU:  # a Megatron-style mpu, as DeepSpeed takes it (zero_ref's configure takes it too)
        def get_model_parallel_group(self):
            return groups.tp

        def get_model_parallel_rank(self):
            return dist.get_rank(groups.tp)

        def get_model_parallel_world_size(self):
            return dist.get_world_size(groups.tp)

        def get_data_parallel_rank(self):
            return 0

    out["plain"] = step("plain")
    ck.checkpoint_layers(model.blocks)
    for name, kw in [("whole", {}), ("partitioned", dict(partition_activations=True)),
                     ("partitioned+cpu", dict(partition_activations=True, checkpoint_in_cpu=True)),
                     ("partitioned+contiguous", dict(partition_activations=True, contiguous_checkpointing=True,
                                                     num_checkpoints=L)),
                     ("mpu object", dict(partition_activations=True))]:
        ck.configure(MPU() if name == "mpu object" else groups, **kw)
        out[name] = step(name)
    ck.configure(groups, partition_activations=True, contiguous_checkpointing=True, num_checkpoints=L - 1)
    try:
        step("overflow")
    except RuntimeError as e:
        out["overflow"] = str(e)
    ck.configure(groups)
    ck.checkpoint_layers(model.blocks, 0)
    out["deepspeed"] = ds_mode(False)
    out["deepspeed partitioned"] = ds_mode(True)
    # different dropout streams per tp rank from the tracker, the same default stream
    ck.model_parallel_cuda_manual_seed(5)
    with ck.get_cuda_rng_tracker().fork():
        mp = torch.rand(3)
    out["rng"] = (mp, torch.rand(3))
    return out


@pytest.fixture(scope="module")
def ranks():
    return zero_ref.launch(two_ranks, 2, timeout=600, echo=False)


def test_partitioned_gradients_equal_plain_and_each_rank_keeps_half(ranks):
    sbh4 = S * B * H * 4
    for r in ranks:
        plain = r["plain"]
        for name in ("whole", "partitioned", "partitioned+cpu", "partitioned+contiguous", "mpu object",
                     "deepspeed", "deepspeed partitioned"):
            assert_same_bits(r[name][:2], plain[:2])
        assert r["whole"][2] == L * sbh4
        for name in ("partitioned", "partitioned+cpu", "partitioned+contiguous", "mpu object"):
            assert r[name][2] == L * sbh4 // 2, name          # measured: 1/tp of each block input
        assert r["partitioned"][3] == {"device": L * sbh4 // 2, "host": 0}
        assert r["partitioned+cpu"][3] == {"device": 0, "host": L * sbh4 // 2}
        assert "all_gather" not in r["whole"][4]
        assert r["partitioned"][4]["all_gather"] == {"calls": L, "bytes": L * sbh4, "wire_bytes": L * sbh4 / 2}
        # The recompute repeats the forward's collectives: 2 all-reduces per block (attention, MLP).
        assert r["whole"][4]["all_reduce"]["calls"] == r["plain"][4]["all_reduce"]["calls"] + 2 * L
        assert "more than num_checkpoints=2 checkpoints before a backward" in r["overflow"]


def test_engine_reads_the_section(ranks):
    for r in ranks:
        assert len(r["engine_notes"]) == 1 and "nothing to split over" in r["engine_notes"][0]
        assert r["engine_settings"] == {"partition_activations": False, "contiguous_checkpointing": False,
                                        "num_checkpoints": L, "checkpoint_in_cpu": True, "synchronize": False,
                                        "profile": False, "tp_size": 1}


def test_model_parallel_seed_differs_per_tp_rank(ranks):
    (mp0, dflt0), (mp1, dflt1) = ranks[0]["rng"], ranks[1]["rng"]
    assert torch.equal(dflt0, dflt1) and not torch.equal(mp0, mp1)


def test_no_warning_when_an_input_requires_grad():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = torch.ones(3, requires_grad=True)
        ck.checkpoint(torch.sin, x).sum().backward()
    assert torch.equal(x.grad, torch.cos(torch.ones(3)))
