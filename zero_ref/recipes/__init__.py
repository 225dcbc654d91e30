"""Recipes: training set-ups that compose the wings below (parallel layers, ZeRO stages, checkpoints)."""
