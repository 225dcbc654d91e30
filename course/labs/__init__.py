"""Lab scripts run at a terminal with torchrun (see README)."""
