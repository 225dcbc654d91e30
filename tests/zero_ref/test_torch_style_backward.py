"""``loss.backward()`` + ``engine.step()``: the same training as ``engine.backward(loss)`` + ``engine.step()``.

Two gloo ranks, gradient accumulation 2, gradient clipping on (tests/zero_ref/test_engine.py's config). At ZeRO
1-3 the script's own backward must be scaled by 1/GAS and reduced by the stage exactly as the engine's:
losses, gradient norms and weights equal bit for bit (GAS 2 is a power of two, so dividing the
parameters' gradients rather than the loss rounds nowhere). Against DeepSpeed 0.19.8 doing the same
(the peers test): losses to 1e-6 relative, norms and weights to 1e-6, the tolerance of test_engine.py
(another summation order). The loss there is computed outside the model from the logits it returns,
the usual ``criterion(engine(x), y)``: for a model returning ``(logits, loss)``, DeepSpeed 0.19.8
divides by GAS at both outputs and its ZeRO-1/2 gradient norm comes out halved (zero_ref/ds/engine.py says
why). Several backwards before one step (a GAN's) train as one backward of their sum, at every stage
(to 1e-6: the halves accumulate in another order), and at ZeRO-0 as DeepSpeed's. ZeRO-0's
loss.backward() and fp16 without ``engine.scale`` are refused, each with an error naming what to do; a backward
on the module called directly only fills ``param.grad`` (tests/zero_ref/test_outside_engine.py).
"""
import os

import pytest
import torch
import torch.nn.functional as F

import zero_ref
from tests.zero_ref.test_engine import GAS, STEPS, ds_config
from tests.zero_ref.cases import build_model, micro_batch


def train(rank, world, stage: int, how: str, which: str = "zero_ref", bf16: bool = False, offload: bool = False) -> dict:
    """``how``: "engine" (engine.backward(loss)), "torch" (loss.backward(), the loss the model returns),
    "criterion" (loss.backward(), the loss computed from the logits outside the model), "twice"
    (engine.backward(loss / 2), then (loss / 2).backward()), "engine_twice" (engine.backward(loss / 2) twice)."""
    if which == "deepspeed":
        os.environ["DS_ACCELERATOR"] = "cpu"  # (in a rank's own process)
        import deepspeed as ds
    else:
        import zero_ref.ds as ds
    model = build_model()
    config = ds_config(stage, bf16)
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    engine, *_ = ds.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                               config=config)
    losses, norms = [], []
    try:
        for step in range(STEPS):
            for micro in range(GAS):
                idx, targets = micro_batch(step, micro, rank, world, GAS)
                logits, loss = engine(idx, targets)
                if how == "criterion":
                    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
                if how == "twice":  # two backwards, one step: half the loss each
                    engine.backward(loss / 2, retain_graph=True)
                    (loss / 2).backward()
                elif how == "engine_twice":
                    engine.backward(loss / 2, retain_graph=True)
                    engine.backward(loss / 2)
                else:
                    engine.backward(loss) if how == "engine" else loss.backward()
                engine.step()
                losses.append(loss.item())
            norm = engine.get_global_grad_norm()  # (None from DeepSpeed's ZeRO-0 engine)
            norms.append(None if norm is None else float(norm))
    except RuntimeError as e:
        return {"error": str(e)}
    with ds.zero.GatheredParameters(list(model.parameters())) if stage == 3 else torch.no_grad():
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return dict(losses=losses, norms=norms, weights=weights, steps=engine.global_steps)


def zero_ref_runs(rank, world):
    runs = {(stage, how): train(rank, world, stage, how) for stage in (1, 2, 3) for how in ("engine", "torch")}
    runs.update({(2, how, "bf16"): train(rank, world, 2, how, bf16=True) for how in ("engine", "torch")})
    runs[0, "torch"] = train(rank, world, 0, "torch")
    runs.update({(stage, "twice"): train(rank, world, stage, "twice" if stage else "engine_twice")
                 for stage in (0, 1, 2, 3)})
    runs[0, "engine"] = train(rank, world, 0, "engine")
    return runs


@pytest.fixture(scope="module")
def runs():
    return zero_ref.launch(zero_ref_runs, 2, timeout=600, echo=False)


@pytest.mark.parametrize("case", [(1,), (2,), (3,), (2, "bf16")], ids=["zero1", "zero2", "zero3", "zero2-bf16"])
def test_loss_backward_trains_as_engine_backward(runs, case):
    stage, *precision = case
    for res in runs:
        ours, engine = res[(stage, "torch", *precision)], res[(stage, "engine", *precision)]
        assert ours["steps"] == engine["steps"] == STEPS
        assert ours["losses"] == engine["losses"] and ours["norms"] == engine["norms"]  # bit for bit
        assert ours["norms"][0] > ds_config(stage)["gradient_clipping"]  # clipping acts: the norm's scale counts
        for name, w in engine["weights"].items():
            assert torch.equal(ours["weights"][name], w), name
    assert runs[0][(1, "torch")]["weights"] != {}  # (the weights were read)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_backwards_per_micro_batch_train_as_one_of_the_sum(runs, stage):
    """The second backward of a boundary micro-step must not reduce the first one's gradients again (stages
    0-1 reduce in place): the weights stay one backward's to 1e-6 (halves accumulate in another order)."""
    for res in runs:
        ours, once = res[(stage, "twice")], res[(stage, "engine")]
        assert ours["steps"] == STEPS and ours["losses"] == pytest.approx(once["losses"], rel=1e-6)
        assert ours["norms"] == pytest.approx(once["norms"], rel=1e-6)
        for name, w in once["weights"].items():
            err = (ours["weights"][name] - w).abs().max().item()
            assert err <= 1e-6 * max(1.0, w.abs().max().item()), (stage, name, err)


def test_two_backwards_with_zero_offload(one_rank):
    """ZeRO-Offload sums each reduction into the host's gradient partition: a second backward of the
    micro-step must then start the device buffer from zero (one rank shows a double count too)."""
    once, twice = (train(0, 1, 1, how, offload=True) for how in ("engine", "engine_twice"))
    assert twice["norms"] == pytest.approx(once["norms"], rel=1e-6)
    for name, w in once["weights"].items():
        assert torch.allclose(twice["weights"][name], w, rtol=0, atol=1e-6 * max(1.0, w.abs().max().item())), name


def test_loss_backward_at_zero0_is_refused_as_deepspeed_refuses_it(runs):
    for res in runs:
        assert res[(0, "torch")]["error"].startswith("loss.backward() at ZeRO stage 0 is refused, as DeepSpeed")


def test_misuses_are_refused_with_what_to_do(one_rank):
    def engine_at(stage, **config):
        torch.manual_seed(0)
        cfg = {**ds_config(stage, scheduler=False, gas=2), **config}
        engine, *_ = zero_ref.initialize(model=build_model(), config=cfg)
        return engine

    def raises(fn, words):
        with pytest.raises((RuntimeError, ValueError), match=words) as info:
            fn()
        assert "\n" not in str(info.value)

    batch = micro_batch(0, 0, 0, 1, 2)
    engine = engine_at(2)
    _, loss = engine(*batch)
    loss.backward()
    engine.step()
    engine.module(*batch)[1].backward()  # the module called directly: into param.grad, as a plain module's
    assert all(p.grad is not None for p in engine.module.parameters() if p.requires_grad)
    raises(lambda: engine.step(), "must follow exactly one backward per micro-batch")  # that one did not count
    engine.zero_grad()  # DeepSpeed's: every param.grad to None
    assert all(p.grad is None for p in engine.module.parameters())
    raises(lambda: (engine(*batch)[1].detach() * 2).sum().backward(), "does not require grad")  # torch's own error
    raises(lambda: engine.backward(engine(*batch)[0]), "loss must be a scalar tensor")
    raises(lambda: engine.scale(torch.ones(())), "loss must be a scalar tensor with a grad_fn")
    _, loss = engine(*batch)
    assert engine.scale(loss) is loss  # fp32: no loss scale
    loss.backward()
    engine.step()
    assert engine.micro_steps == 2 and engine.global_steps == 1
    fp16 = engine_at(1, fp16={"enabled": True, "initial_scale_power": 4})
    raises(lambda: fp16(*batch)[1].backward(), "fp16: loss.backward\\(\\) without the loss scale")
    _, loss = fp16(*batch)
    scaled = fp16.scale(loss)
    assert scaled.item() == loss.item() * 16 == loss.item() * fp16.loss_scale
    scaled.backward()
    fp16.step()
    assert fp16.micro_steps == 1


def test_retain_graph_and_scale_wrt_gas_as_deepspeeds(one_rank):
    """retain_graph is handed to autograd (a second backward through the graph works); scale_wrt_gas=False
    leaves the division to the script: backward(loss / GAS, scale_wrt_gas=False) is backward(loss)."""
    grads = {}
    for how in ("default", "no_gas"):
        torch.manual_seed(0)
        engine, *_ = zero_ref.initialize(model=build_model(), config=ds_config(1, scheduler=False, gas=2))
        _, loss = engine(*micro_batch(0, 0, 0, 1, 2))
        if how == "default":
            assert engine.backward(loss, retain_graph=True).item() == loss.item() / 2  # DeepSpeed returns loss / GAS
            torch.autograd.grad(loss, engine.module.ln_f.weight)  # the graph is still there
        else:
            assert engine.backward(loss / 2, scale_wrt_gas=False).item() == loss.item() / 2
        grads[how] = torch.cat([b.flat_grad for b in engine.optimizer.buckets])
    assert torch.equal(grads["default"], grads["no_gas"]) and grads["default"].abs().sum() > 0


def peer_runs(rank, world):
    runs = {(which, stage, how): train(rank, world, stage, how, which) for stage in (0, 1, 2, 3)
            for which in ("zero_ref", "deepspeed") for how in ("criterion",)}
    runs.update({(which, 0, "engine_twice"): train(rank, world, 0, "engine_twice", which)
                 for which in ("zero_ref", "deepspeed")})
    return runs


@pytest.mark.slow
@pytest.mark.peers
def test_loss_backward_as_deepspeeds():
    """Both engines with the script's own loss.backward(): the same losses, gradient norms and weights at
    ZeRO 1-3; at ZeRO-0 both refuse it (zero_ref's error quotes DeepSpeed's), and both train two
    engine.backward per micro-batch alike."""
    runs = zero_ref.launch(peer_runs, 2, timeout=900, echo=False)
    for res in runs:
        for stage in (1, 2, 3):
            ours, theirs = res[("zero_ref", stage, "criterion")], res[("deepspeed", stage, "criterion")]
            assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6), stage
            assert ours["norms"] == pytest.approx(theirs["norms"], rel=1e-6), stage
            for name, w in theirs["weights"].items():
                err = (ours["weights"][name] - w).abs().max().item()
                assert err <= 1e-6 * max(1.0, w.abs().max().item()), (stage, name, err)
        ours, theirs = res[("zero_ref", 0, "engine_twice")], res[("deepspeed", 0, "engine_twice")]
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6)
        for name, w in theirs["weights"].items():
            err = (ours["weights"][name] - w).abs().max().item()
            assert err <= 1e-6 * max(1.0, w.abs().max().item()), (0, name, err)
        theirs = res[("deepspeed", 0, "criterion")]["error"]
        assert theirs.startswith("Direct calls to tensor.backward() are not supported in this configuration")
        assert "Direct calls to tensor.backward() are not supported" in res[("zero_ref", 0, "criterion")]["error"]
