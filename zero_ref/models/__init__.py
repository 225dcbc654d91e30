"""Toy models used across the course (torch)."""
from zero_ref.models.gpt import GPT, Block, GPTConfig, make_batch

__all__ = ["GPT", "Block", "GPTConfig", "make_batch"]
