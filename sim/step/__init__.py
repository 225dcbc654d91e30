"""One simulated training step: lowering to a task graph, scheduling it, idle time and memory over time."""
