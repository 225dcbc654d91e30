"""Choosing a plan: lower bounds, the auto-tuner, the ZeRO / offload ladder, and ``python -m sim plan``."""
