"""zero_ref.ds.pipe against deepspeed.pipe: the same PipelineModule script, the same losses and weights.

Two CPU ranks (gloo), fp32: a five-layer model with a tied layer (the first layer's weight is used again,
transposed, by the last), cut by DeepSpeed's "parameters" method, trained by ``train_batch`` for 4 steps
of 4 micro-batches under a WarmupLR schedule, at ZeRO-0 and ZeRO-1, once as 2 stages × 1 replica and once
as 1 stage × 2 replicas (ZeRO-1 then shards over the 2 data-parallel ranks). Both engines build the
layers from the same seed, spend the same random numbers and add the same gradients in the same order
(the 1F1B backwards run micro-batch 0, 1, ...): losses and weights agree to 1e-6 relative.
"""
import os

import pytest
import torch
import torch.nn as nn

import zero_ref

STEPS, GAS, MICRO = 4, 4, 2


def tied_out(module, x):  # the tied layer used again, transposed (an output head sharing the input weight)
    return x @ module.weight


def layers(spec):
    LayerSpec, TiedLayerSpec = spec.LayerSpec, spec.TiedLayerSpec
    return [TiedLayerSpec("io", nn.Linear, 6, 6, bias=False), LayerSpec(nn.Linear, 6, 16), nn.Tanh(),
            LayerSpec(nn.Linear, 16, 6), TiedLayerSpec("io", nn.Linear, 6, 6, bias=False, forward_fn=tied_out)]


def config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.1, "torch_adam": True}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 2e-2,
                                                          "warmup_num_steps": 3, "warmup_type": "linear"}},
            "zero_optimization": {"stage": stage}, "steps_per_print": 1000}


def batches(dp_rank: int):
    """This data-parallel rank's GAS micro-batches, again every step (both stages of a pipeline read the same
    stream): the loss of a model that learns falls."""
    k = 0
    while True:
        g = torch.Generator().manual_seed(100 * (k % GAS) + dp_rank)
        x = torch.randn(MICRO, 6, generator=g)
        yield x, torch.sin(3 * x)
        k += 1


def train(rank, world, which: str, stage: int, num_stages: int) -> dict:
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("LOCAL_RANK", "0")
    if which == "deepspeed":
        import deepspeed as ds
        import deepspeed.pipe as pipe
    else:
        ds, pipe = zero_ref, zero_ref.ds.pipe
    ds.init_distributed(dist_backend="gloo")  # a PipelineModule needs the process groups (in DeepSpeed too)
    torch.manual_seed(0)
    net = pipe.PipelineModule(layers=layers(pipe), num_stages=num_stages, loss_fn=nn.MSELoss(),
                              partition_method="parameters")
    engine, *_ = ds.initialize(model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
                               config=config(stage))
    data = batches(rank % (world // num_stages))
    losses = [engine.train_batch(data).item() for _ in range(STEPS)]
    evaluated = engine.eval_batch(batches(7)).item()
    return dict(losses=losses, eval=evaluated, steps=engine.global_steps, lr=engine.get_lr(),
                weights={n: p.detach().clone() for n, p in net.state_dict().items()})


def both(rank, world):
    runs = {(which, stage, p): train(rank, world, which, stage, p)
            for stage in (0, 1) for p in (2, 1) for which in ("zero_ref", "deepspeed")}
    refused = []
    for which in ("zero_ref", "deepspeed"):
        try:
            train(rank, world, which, 2, 2)
        except (AssertionError, ValueError) as e:
            refused.append(str(e))
    runs["refused"] = refused
    return runs


@pytest.fixture(scope="module")
def runs():
    return zero_ref.launch(both, 2, timeout=600, echo=False)


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("num_stages", [2, 1])
def test_train_batch_equals_deepspeeds_pipeline_engine(runs, stage, num_stages):
    for rank, res in enumerate(runs):
        ours, theirs = res[("zero_ref", stage, num_stages)], res[("deepspeed", stage, num_stages)]
        assert ours["steps"] == theirs["steps"] == STEPS
        assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-12)
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6), rank
        assert ours["eval"] == pytest.approx(theirs["eval"], rel=1e-6)
        assert ours["losses"][-1] < ours["losses"][0]  # it trains
        assert ours["weights"].keys() == theirs["weights"].keys()  # the same layers on the same stage
        for name, w in theirs["weights"].items():
            err = (ours["weights"][name] - w).abs().max().item()
            assert err <= 1e-6 * max(1.0, w.abs().max().item()), (name, err)
    if num_stages == 2:  # the stages hold different layers; every stage reports the same loss
        assert runs[0][("zero_ref", stage, 2)]["weights"].keys() != runs[1][("zero_ref", stage, 2)]["weights"].keys()
        assert runs[0][("zero_ref", stage, 2)]["losses"] == runs[1][("zero_ref", stage, 2)]["losses"]


@pytest.mark.slow
@pytest.mark.peers
def test_zero2_with_a_pipeline_is_refused_as_in_deepspeed(runs):
    ours, theirs = runs[0]["refused"]
    assert theirs == "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
    assert ours.startswith("ZeRO stage 2 cannot be combined with pipeline parallelism") and theirs in ours


def test_deepspeeds_split_of_the_layers():
    from zero_ref.ds.pipe.module import partition_balanced, partition_uniform
    utils = pytest.importorskip("deepspeed.runtime.utils")
    cases = [([5, 1, 1, 1, 5], 2), ([36, 112, 0, 102, 0], 2), ([1, 2, 3, 4, 5, 6, 7], 3), ([0, 0, 1, 0], 2),
             ([3, 3], 4), ([7, 1, 1, 1, 1, 1, 1, 7], 4)]
    for weights, parts in cases:
        assert partition_balanced(weights, parts) == list(utils.partition_balanced(weights, parts)), weights
    for n, parts in ((7, 3), (2, 4), (9, 3), (10, 4)):
        assert partition_uniform(n, parts) == list(utils.partition_uniform(n, parts))


def _training_data_run(rank, world, with_training_data: bool) -> list[float]:
    os.environ.setdefault("LOCAL_RANK", "0")
    zero_ref.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    net = zero_ref.ds.pipe.PipelineModule(layers=layers(zero_ref.ds.pipe), num_stages=2, loss_fn=nn.MSELoss(),
                                          partition_method="parameters")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(STEPS * GAS * MICRO - MICRO, 6, generator=g)  # the last step starts the data over
    data = torch.utils.data.TensorDataset(x, torch.sin(3 * x))
    engine, _, loader, _ = zero_ref.initialize(model=net, config=config(1), model_parameters=net.parameters(),
                                               training_data=data if with_training_data else None)
    if with_training_data:
        assert loader is engine.training_dataloader is not None
        return [engine.train_batch().item() for _ in range(STEPS)]
    in_order = zero_ref.ds.utils.RepeatingLoader(torch.utils.data.DataLoader(data, batch_size=MICRO))
    return [engine.train_batch(data_iter=in_order).item() for _ in range(STEPS)]


@pytest.mark.slow
def test_train_batch_reads_training_data_in_order_without_a_data_iter():
    """``initialize(training_data=...)`` then ``train_batch()``, as DeepSpeed's pipeline example trains: the first and
    last stages read the data set in order, round and round (DeepSpeed's ``PipelineEngine._build_data_iter``)."""
    engine_loader = zero_ref.launch(_training_data_run, 2, True)
    own_iterator = zero_ref.launch(_training_data_run, 2, False)
    assert engine_loader[0] == own_iterator[0] == engine_loader[1]
    assert len(set(engine_loader[0])) == STEPS
