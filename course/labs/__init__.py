"""Labs: scripts run at a terminal with torchrun (data_parallel, three_d, elastic, either_engine, clients/; see
README), and each chapter's experiment harness (chNN.py: the rank functions, run tables and figures a chapter's
cells call, so that a cell holds one thought)."""
