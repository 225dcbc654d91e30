"""Real steps measured: what the simulator is calibrated on (chapters 17, 28 and 30).

``profile`` times a step of the course GPT on gloo ranks and sweeps the collectives over message sizes;
``torch_trace`` records the same step with torch.profiler; ``trial`` trains a DeepSpeed config through
``zero_ref.initialize`` and reports what each rank held. This face imports nothing.
"""
