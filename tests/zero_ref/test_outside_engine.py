"""A module called outside its engine: the GAN of tests/clients/gan.py (DeepSpeedExamples' training/gan shape).

The discriminator is called as ``netD(x)``, not through its engine, before ``engineD.backward``; the
generator's loss flows back through ``netD(fake)`` into netD's parameters under ``engineG.backward``. DeepSpeed
0.19.8's stage 0 keeps those gradients in ``param.grad``: ``netD.zero_grad()`` drops them, and without it they
join D's next step (all-reduced with it at the boundary). zero_ref does the same at every stage. DeepSpeed's
stages 1-3 do not (docs/deepspeed_differences.md): at ZeRO-1 the second ``engineD.backward`` of a step replaces
the first one's gradient, and at ZeRO-2/3 the generator's backward puts netD's gradients in engineD's
reduction bucket, so D's next backward fails ("has already been reduced"; ZeRO-3: an assertion on duplicate
parameters).

The slow test trains the GAN on two gloo ranks at stages 0-3 against a single-process reference that does
what DeepSpeed's stage 0 does; the peers test runs gan.py under torchrun with DeepSpeed and with
``-m zero_ref.ds.run``. Losses of both nets at every step, on every rank, to 1e-6 relative (fp32).
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import zero_ref
from tests.helpers import PEER_RUN, ROOT, torchrun_env

GAN = ROOT / "tests" / "clients" / "gan.py"
WORLD, STEPS, BATCH, LR, BETA1, SEED = 2, 6, 8, 0.01, 0.5, 999  # gan.py's defaults


def config(stage: int) -> dict:
    # gradient_clipping 0: DeepSpeed's default is 1.0, torch's Adam clips nothing
    return {"train_batch_size": BATCH * WORLD, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
            "steps_per_print": 1000}


def load_gan(deepspeed):
    """tests/clients/gan.py as a module, its ``import deepspeed`` answered with ``deepspeed``."""
    spec = importlib.util.spec_from_file_location("gan_client", GAN)
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("deepspeed")
    sys.modules["deepspeed"] = deepspeed
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["deepspeed"]
        else:
            sys.modules["deepspeed"] = saved
    return module


def reference(keep_grads: bool = False, real: bool = True) -> list[dict]:
    """DeepSpeed's stage 0 in one process: D steps on the mean over ranks of its two losses' gradients (plus, with
    ``keep_grads``, the gradient the generator's loss left in netD's parameters one step earlier); G on the mean of
    its own. torch's Adam, as the script's client optimizers. Each rank's losses, as gan.train returns them.
    ``real=False`` leaves errD_real's gradient out (what DeepSpeed's ZeRO-1 does)."""
    import zero_ref.ds
    gan = load_gan(zero_ref.ds)  # (only its nets and data)
    torch.manual_seed(SEED)
    netG, netD = gan.Generator(), gan.Discriminator()
    optD = torch.optim.Adam(netD.parameters(), lr=LR, betas=(BETA1, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=LR, betas=(BETA1, 0.999))
    bce, ones, zeros = nn.BCELoss(), torch.ones(BATCH), torch.zeros(BATCH)
    out = [{"loss_d": [], "loss_g": []} for _ in range(WORLD)]
    held = [[torch.zeros_like(p) for p in netD.parameters()] for _ in range(WORLD)]  # G's gradient in netD, per rank

    def grads(loss, params):
        return torch.autograd.grad(loss, list(params))

    for i in range(STEPS):
        fakes, sum_d = [], [torch.zeros_like(p) for p in netD.parameters()]
        for r in range(WORLD):
            err_real = bce(netD(gan.real_batch(i, r, BATCH)), ones)
            fakes.append(netG(gan.noise_batch(i, r, BATCH)))
            err_fake = bce(netD(fakes[r].detach()), zeros)
            real_grads, fake_grads = grads(err_real, netD.parameters()), grads(err_fake, netD.parameters())
            for s, a, b, h in zip(sum_d, real_grads, fake_grads, held[r]):
                s += (a if real else 0) + b + (h if keep_grads else 0)
            out[r]["loss_d"].append((err_real + err_fake).item())
        for p, s in zip(netD.parameters(), sum_d):
            p.grad = s / WORLD
        optD.step()
        sum_g = [torch.zeros_like(p) for p in netG.parameters()]
        for r in range(WORLD):
            err_g = bce(netD(fakes[r]), ones)
            params = list(netG.parameters()) + list(netD.parameters())
            g = grads(err_g, params)
            for s, a in zip(sum_g, g[:len(sum_g)]):
                s += a
            held[r] = list(g[len(sum_g):])
            out[r]["loss_g"].append(err_g.item())
        for p, s in zip(netG.parameters(), sum_g):
            p.grad = s / WORLD
        optG.step()
    return out


def zero_ref_gans(rank, world, configs: dict, flags: dict) -> dict:
    """gan.train on zero_ref (its ``deepspeed`` is zero_ref.ds) for each ``configs[key]`` with ``flags[key]``."""
    import zero_ref.ds
    gan = load_gan(zero_ref.ds)
    parser = zero_ref.ds.add_config_arguments(gan.get_argument_parser())
    return {key: gan.train(parser.parse_args(["--deepspeed_config", path, *flags[key]]))
            for key, path in configs.items()}


CASES = [(stage, keep) for stage in (0, 1, 2, 3) for keep in (False, True)]


@pytest.fixture(scope="module")
def zero_ref_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gan")
    configs, flags = {}, {}
    for stage, keep in CASES:
        path = folder / f"stage{stage}.json"
        path.write_text(json.dumps(config(stage)))
        configs[stage, keep], flags[stage, keep] = str(path), ["--keep_grads"] if keep else []
    return zero_ref.launch(zero_ref_gans, WORLD, configs, flags, timeout=600, echo=False)


@pytest.mark.slow
@pytest.mark.parametrize("stage,keep", CASES, ids=[f"zero{s}{'-keep_grads' if k else ''}" for s, k in CASES])
def test_gan_trains_as_deepspeeds_stage0_at_every_stage(zero_ref_runs, stage, keep):
    expected = reference(keep_grads=keep)
    for rank, runs in enumerate(zero_ref_runs):
        ours = runs[stage, keep]
        assert len(ours["loss_d"]) == len(ours["loss_g"]) == STEPS
        assert ours["loss_d"] == pytest.approx(expected[rank]["loss_d"], rel=1e-6), rank
        assert ours["loss_g"] == pytest.approx(expected[rank]["loss_g"], rel=1e-6), rank


def test_reference_tells_the_cases_apart():
    """What the slow test's equalities rest on: keeping G's gradient in netD changes D's steps, and so do
    dropping a rank's data or the first of D's two losses (DeepSpeed's ZeRO-1)."""
    kept, cleared = reference(keep_grads=True), reference()
    assert kept[0]["loss_d"][:2] == cleared[0]["loss_d"][:2]  # G's gradient joins D's second step, seen at step 3
    assert abs(kept[0]["loss_d"][2] - cleared[0]["loss_d"][2]) > 1e-5
    assert cleared[0]["loss_d"] != cleared[1]["loss_d"]  # each rank draws its own data
    assert abs(reference(real=False)[0]["loss_g"][0] - cleared[0]["loss_g"][0]) > 1e-3


# ------------------------------------------------------------------ DeepSpeed itself, the same script
def torchrun(engine: str, stage: int, tmp_path, *flags) -> subprocess.CompletedProcess:
    cfg = tmp_path / f"stage{stage}.json"
    cfg.write_text(json.dumps(config(stage)))
    launcher = ["-m", "zero_ref.ds.run"] if engine == "zero_ref" else PEER_RUN
    cmd = [str(Path(sys.executable).with_name("torchrun")), f"--nproc_per_node={WORLD}", *launcher, str(GAN),
           "--deepspeed_config", str(cfg), *flags]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env=torchrun_env(DS_ACCELERATOR="cpu"))


def result(out: subprocess.CompletedProcess) -> dict:
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def assert_same(ours: dict, theirs: dict) -> None:
    for key in ("loss_d", "loss_g"):
        assert len(ours[key]) == STEPS and ours[key] == pytest.approx(theirs[key], rel=1e-6), key


@pytest.fixture(scope="module")
def deepspeed_stage0(tmp_path_factory) -> dict:
    """DeepSpeed's losses at stage 0: with netD.zero_grad() (False) and without (True, --keep_grads)."""
    folder = tmp_path_factory.mktemp("gan_deepspeed")
    return {keep: result(torchrun("deepspeed", 0, folder, *(["--keep_grads"] if keep else [])))
            for keep in (False, True)}


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.timeout(900)  # (DeepSpeed's runs take a minute each on a busy machine)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_gan_script_on_zero_ref_gives_deepspeeds_stage0_losses(deepspeed_stage0, stage, tmp_path):
    """The same script, unedited, under torchrun: zero_ref's losses are DeepSpeed's stage 0 at every stage."""
    assert_same(result(torchrun("zero_ref", stage, tmp_path)), deepspeed_stage0[False])
    if stage in (0, 2):  # a gradient held over: flat buffer at 0, gradient partition at 2
        assert_same(result(torchrun("zero_ref", stage, tmp_path, "--keep_grads")), deepspeed_stage0[True])


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.timeout(900)
def test_deepspeeds_own_zero1_to_3_as_documented(deepspeed_stage0, tmp_path):
    """docs/deepspeed_differences.md: DeepSpeed 0.19.8's ZeRO-1 steps D on errD_fake's gradient alone (its
    one-backward form agrees with stage 0); ZeRO-2/3 fail at D's backward of step 2."""
    stage0 = deepspeed_stage0[False]
    assert_same(result(torchrun("deepspeed", 1, tmp_path, "--one_backward")), stage0)
    ds1 = result(torchrun("deepspeed", 1, tmp_path))
    assert_same(ds1, reference(real=False)[0])
    assert abs(ds1["loss_g"][0] - stage0["loss_g"][0]) > 1e-3
    for stage, words in ((2, "has already been reduced"), (3, "AssertionError")):
        out = torchrun("deepspeed", stage, tmp_path)
        assert out.returncode != 0 and words in out.stderr and out.stdout.count("Loss_D") == 1, out.stderr[-3000:]


# ------------------------------------------------------------------ a parameter only a backward outside reached
class TwoHeads(nn.Module):
    """``head`` is what the engine's forward uses; ``side`` only the script's direct call reaches."""

    def __init__(self):
        super().__init__()
        self.head, self.side = nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x):
        return self.head(x)


def side_batch(rank: int) -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(10 + rank))


def left_outside(rank, world, stages) -> dict:
    """One step after a backward outside the engine reached ``side`` only: the weights, gathered."""
    import zero_ref.ds as deepspeed
    out = {}
    for stage in stages:
        torch.manual_seed(0)
        model = TwoHeads()
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.1),
                                          config={**config(stage), "train_batch_size": world})
        x = side_batch(rank)
        model.side(x).pow(2).sum().backward()  # outside the engine: into side's param.grad
        engine.backward(engine(x).sum())
        engine.step()
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            out[stage] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


@pytest.mark.slow
def test_a_gradient_left_outside_joins_the_next_step():
    """As DeepSpeed's stage 0 reduces every param.grad at the boundary, a gradient that only a backward outside the
    engine gave (``side``) is averaged and stepped with the engine's own (``head``), at every stage."""
    runs = zero_ref.launch(left_outside, WORLD, (0, 1, 2, 3), timeout=300, echo=False)
    torch.manual_seed(0)
    model = TwoHeads()
    start = model.side.weight.detach().clone()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for r in range(WORLD):
        x = side_batch(r)
        ((model.side(x).pow(2).sum() + model(x).sum()) / WORLD).backward()
    opt.step()
    for stage in (0, 1, 2, 3):
        for rank, run in enumerate(runs):
            for name, p in model.named_parameters():
                assert torch.allclose(run[stage][name], p.detach(), rtol=1e-6, atol=1e-7), (stage, rank, name)
    assert (runs[0][0]["side.weight"] - start).abs().min() > 0.09  # side took an Adam step (lr 0.1)
