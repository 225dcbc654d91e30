"""sim: a simulator of training steps on a cluster (pure Python + NumPy, no torch).

Builds on zero_ref's torch-free memory model and batch arithmetic.

    import sim
    model = sim.Model.preset("gpt3-175b")
    cluster = sim.Cluster.preset("A100-80GB", nodes=128)
    plan = sim.Plan(zero_stage=1, tp=8, pp=16, dp=8, num_microbatches=64, recompute="full")
    result = sim.simulate(model, cluster, plan)          # step time, TFLOP/s, bubbles, memory, events
    sim.write_chrome_trace(result, "step.json")          # open in ui.perfetto.dev
"""
from sim.cost.cost_model import CostModel
from sim.cost.costs import Costs
from sim.spec.hardware import GPU, GPUS, Cluster
from sim.spec.model import MODELS, Model
from sim.spec.plan import Plan
from sim.step.event_schedule import Contention, DoesNotFit, MemoryCap, SharedLink
from sim.step.pipeline import Slot, bubble_fraction, bubble_overhead, pipeline_timeline, schedule_order, zb_h1_bubble
from sim.step.simulate import Event, SimResult, simulate
from sim.views.trace import chrome_trace, write_chrome_trace
from zero_ref.parallel.schedules import stage_order, warmup_count  # the orders the simulator times (ch.20, ch.23)

__all__ = ["GPU", "GPUS", "MODELS", "Cluster", "Model", "Plan", "Costs", "CostModel", "Event", "SimResult",
           "Contention", "DoesNotFit", "MemoryCap", "SharedLink",
           "simulate", "chrome_trace", "write_chrome_trace", "Slot", "bubble_fraction", "bubble_overhead",
           "pipeline_timeline", "schedule_order", "stage_order", "warmup_count", "zb_h1_bubble"]
