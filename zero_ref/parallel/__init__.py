"""Model parallelism: tensor (Megatron-style), pipeline, 3D, expert (MoE) and context parallelism
(``ring_attention``, and DeepSpeed-Ulysses in ``ulysses``).

Each mode is one module named after it. Some halves are pure Python (no torch), so the simulator
uses them too: ``topology`` (the rank grid; ``groups`` makes its process groups real, passed
explicitly, no global process-group state), ``schedules`` (pipeline orders as data; ``pipeline``
runs them), ``context`` (the zig-zag split and the bytes ring attention and Ulysses send) and
``capacity`` (an expert's token slots and a dispatch's bytes). This face imports nothing, so
``import zero_ref.parallel.topology`` stays torch-free.
"""
