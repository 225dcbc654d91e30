"""Tests of zero_ref: each mechanism on real gloo ranks against a one-process reference, and against DeepSpeed."""
