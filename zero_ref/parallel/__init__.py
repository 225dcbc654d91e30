"""Model parallelism: tensor (Megatron-style), pipeline, 3D and expert (MoE) parallelism.

Each mode is one module named after it. Two halves are pure Python (no torch), so the simulator
uses them too: ``topology`` (the rank grid; ``groups`` makes its process groups real, passed
explicitly, no global process-group state) and ``schedules`` (pipeline orders as data; ``pipeline``
runs them). This face imports nothing, so ``import zero_ref.parallel.topology`` stays torch-free.
"""
