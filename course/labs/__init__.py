"""Labs: scripts run at a terminal with torchrun (data_parallel, three_d, elastic, either_engine, clients/; see
README), and the experiment harness the chapters' cells call, so that a cell holds one thought: a chapter's own
(chNN.py) or an idea several cells share, in a file named after it (zero_ladder, gradient_buckets,
executor_trial, collective_count, …): rank functions, run tables and figures."""
