"""DeepSpeed client scripts in the style of DeepSpeedExamples, each a plain ``import deepspeed`` script.

How a script is run picks the engine: ``torchrun --nproc_per_node=2 tests/clients/x.py ARGS`` trains on
DeepSpeed, ``torchrun --nproc_per_node=2 -m zero_ref.ds.run tests/clients/x.py ARGS`` on zero_ref. Rank 0
prints ``RESULT {json}``; test_clients.py runs each under both and compares.
"""
