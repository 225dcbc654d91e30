"""sim: a simulator of training steps on a cluster (pure Python + NumPy, no torch).

Builds on zero_ref's torch-free memory model and batch arithmetic.

    import sim
    model = sim.Model.preset("gpt3-175b")
    cluster = sim.Cluster.preset("A100-80GB", nodes=128)
    plan = sim.Plan(zero_stage=1, tp=8, pp=16, dp=8, num_microbatches=64, recompute="full")
    result = sim.simulate(model, cluster, plan)          # step time, TFLOP/s, bubbles, memory, events
    sim.write_chrome_trace(result, "step.json")          # open in ui.perfetto.dev

Modules: ``config`` (Model, GPU, Cluster + presets), ``plan`` (Plan, from a DeepSpeed config),
``cost`` (FLOPs and alpha-beta collectives, ``Costs``), ``topology`` (rank grid, links),
``pipeline`` (bubble closed forms, schedule orders), ``graph`` (the step's task graph),
``engine`` (list scheduling, ``simulate``), ``events`` (event-heap engine: shared links, memory caps),
``idle`` (idle time by cause), ``memory_timeline``, ``trace`` (Chrome/Perfetto JSON), ``render``
(Gantt, memory stack), ``widgets`` (ipywidgets explorers), ``published``, ``published_deepspeed``,
``published_hopper`` and ``published_run`` (published runs with their sources), ``calibrate``
(fitted constants), ``validation``
(simulated vs published table: ``python -m sim.validation``), ``fit_local`` (calibration on real zero_ref runs on this machine),
``utilization`` (MFU / HFU), ``search`` (plan auto-tuner), ``bounds`` (memory and step-time lower
bounds), ``advice`` (the ZeRO / offload ladder), ``context`` (context parallelism: ring attention and
Ulysses, per layer), ``moe`` (experts: all-to-all, capacity, expert-data-parallel ZeRO).
"""
from sim.config import GPU, GPUS, MODELS, Cluster, Model
from sim.cost import CostModel, Costs
from sim.engine import Event, SimResult, simulate
from sim.events import Contention, DoesNotFit, MemoryCap, SharedLink
from sim.pipeline import Slot, bubble_fraction, bubble_overhead, pipeline_timeline, schedule_order
from sim.plan import Plan
from sim.trace import chrome_trace, write_chrome_trace
from zero_ref.parallel.schedules import stage_order, warmup_count

__all__ = ["GPU", "GPUS", "MODELS", "Cluster", "Model", "Plan", "Costs", "CostModel", "Event", "SimResult",
           "Contention", "DoesNotFit", "MemoryCap", "SharedLink",
           "simulate", "chrome_trace", "write_chrome_trace", "Slot", "bubble_fraction", "bubble_overhead",
           "pipeline_timeline", "schedule_order", "stage_order", "warmup_count"]
