"""Tests of the simulator: closed forms, published runs, the planner and its views."""
