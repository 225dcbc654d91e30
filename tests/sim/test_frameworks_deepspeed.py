"""The simulator's DeepSpeed volumes against DeepSpeed 0.19.8 itself, counted on two gloo ranks."""
import pytest

import sim
import zero_ref
from sim.step.lowering import build_graph
from sim.step.traffic import bytes_sent
from zero_ref.comm import ring_wire_bytes
from zero_ref.volume import dp_bytes_per_step

pytestmark = [pytest.mark.slow, pytest.mark.peers]
GAS = 2


def deepspeed_payloads(rank, world_size, stages, gas):
    """DeepSpeed's torch.distributed calls in one optimizer step, per stage: [(op, payload bytes)], and Ψ."""
    import os
    import torch
    import torch.distributed as td
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    import deepspeed.ops
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # gloo only
    calls, counting = [], [False]
    payload = {"all_reduce": (0, "tensor"), "reduce": (0, "tensor"), "all_gather_into_tensor": (1, "input_tensor"),
               "reduce_scatter_tensor": (1, "input")}  # (position, keyword) of the payload tensor

    def counted(op, original):  # DeepSpeed's TorchBackend looks these up on torch.distributed at each call
        def call(*args, **kwargs):
            if counting[0]:
                at, name = payload[op]
                t = args[at] if len(args) > at else kwargs[name]
                calls.append((op, t.numel() * t.element_size()))
            return original(*args, **kwargs)
        return call

    for op in payload:
        setattr(td, op, counted(op, getattr(td, op)))
    out = {}
    for stage in stages:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
        cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "bf16": {"enabled": True},
               "gradient_clipping": 0.0, "zero_optimization": {"stage": stage}}
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg)
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
        calls.clear()
        counting[0] = True
        for _ in range(gas):
            engine.backward(engine(x).float().pow(2).mean())
            engine.step()
        counting[0] = False
        out[stage] = list(calls)
    return out, sum(p.numel() for p in model.parameters())


def test_deepspeeds_stage_1_and_2_bytes_are_the_simulators():
    logs, psi = zero_ref.launch(deepspeed_payloads, 2, (1, 2), GAS, timeout=600, echo=False)[0]
    assert psi % 4 == 0  # no padding of the flat buffer (alignment 2N elements): payloads are exact
    model = sim.Model.preset("gpt3-125m")
    for stage, calls in logs.items():
        assert not [op for op, _ in calls if op.startswith("reduce")]  # no reduce-scatter, no reduce
        data = [(op, b) for op, b in calls if b > 16]                   # the overflow flag and norm are scalars
        wire = sum(ring_wire_bytes("all_reduce", b, 2) if op == "all_reduce" else ring_wire_bytes("all_gather", 2 * b, 2)
                   for op, b in data)                                   # all_gather's payload is this rank's half
        assert wire == dp_bytes_per_step(psi, zero_stage=stage, dp=2, micro_steps=GAS)
        plan = sim.Plan(zero_stage=stage, dp=2, num_microbatches=GAS)
        simulated = sum(bytes_sent(build_graph(model, plan), plan).values())
        assert simulated / model.num_params == pytest.approx(wire / psi, rel=1e-12)
