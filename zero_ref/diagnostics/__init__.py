"""Troubleshooting tools for the three ways training goes wrong: out of memory, hangs, divergence.

- ``memory_report(engine_or_stage)`` (``memory_report.py``): model-state bytes this rank holds, by
  category, measured (``zero_ref.measure``) beside the formula (``zero_ref.memory``) and beside the
  simulator's numbers if given; the verdict names any category where measured ≠ expected.
  ``explain_oom`` (or ``report.oom(budget)``) names the category that dominates and the cheapest
  change that fits a budget.
- ``watch_collectives(timeout=...)`` (``watchdog.py``): every ``zero_ref.comm`` call records (op, call
  number on its group, shape, caller) in the process group's store before it is issued; a watchdog
  thread notices a rank stuck in a collective past ``timeout``, prints what every rank of that group
  last did and ends the rank, so ``zero_ref.launch`` (or torchrun) fails at once instead of hanging.
  ``check=True`` compares every call across ranks *before* issuing it and raises on a mismatch.
- ``detect_anomalies(engine_or_module)`` (``anomalies.py``): hooks naming the first module (forward
  order) whose output holds inf/nan, the first gradient (backward order) that does, and, under fp16,
  what overflowed when the loss scaler skips a step. ``find_nonfinite`` checks a model at rest.
"""
from zero_ref.diagnostics.anomalies import Anomalies, Finding, SkippedStep, detect_anomalies, find_nonfinite
from zero_ref.diagnostics.memory_report import MemoryReport, OomAdvice, explain_oom, memory_report
from zero_ref.diagnostics.watchdog import (EXIT_CODE, CollectiveError, CollectiveMismatch, CollectiveTimeout,
                                           timeout_report, watch_collectives)

__all__ = ["MemoryReport", "memory_report", "OomAdvice", "explain_oom", "watch_collectives", "timeout_report",
           "CollectiveError", "CollectiveTimeout", "CollectiveMismatch", "EXIT_CODE", "detect_anomalies",
           "Anomalies", "Finding", "SkippedStep", "find_nonfinite"]
