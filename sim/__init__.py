"""sim: a simulator of training steps on a cluster (pure Python, no torch).

Builds on zero_ref's torch-free memory model. ``sim.pipeline`` holds the pipeline-schedule
closed forms and a unit-level schedule timeline they are checked against.
"""
from sim.pipeline import Slot, bubble_fraction, bubble_overhead, pipeline_timeline

__all__ = ["Slot", "bubble_fraction", "bubble_overhead", "pipeline_timeline"]
