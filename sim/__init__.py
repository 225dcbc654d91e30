"""sim: a simulator of training steps on a cluster (pure Python + NumPy, no torch).

Builds on zero_ref's torch-free memory model and batch arithmetic. Modules: ``config`` (Model,
GPU, Cluster + presets), ``plan`` (Plan, from a DeepSpeed config), ``cost`` (FLOPs and alpha-beta
collectives, ``Costs``), ``topology`` (rank grid, links), ``pipeline`` (bubble closed forms,
schedule orders).
"""
from sim.config import GPU, GPUS, MODELS, Cluster, Model
from sim.cost import CostModel, Costs
from sim.pipeline import (Slot, bubble_fraction, bubble_overhead, pipeline_timeline, schedule_order,
                          stage_order, warmup_count)
from sim.plan import Plan

__all__ = ["GPU", "GPUS", "MODELS", "Cluster", "Model", "Plan", "Costs", "CostModel", "Slot", "bubble_fraction",
           "bubble_overhead", "pipeline_timeline", "schedule_order", "stage_order", "warmup_count"]
