"""Choosing a plan: the auto-tuner, the ZeRO / offload ladder, and ``python -m sim plan``."""
