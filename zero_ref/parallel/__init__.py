"""Model parallelism on real ranks: tensor (Megatron-style), pipeline, 3D and expert (MoE) parallelism.

Each mode is one module named after it; process groups come from the torch-free rank grid in
``zero_ref.topology`` and are passed explicitly (no global process-group state).
"""
