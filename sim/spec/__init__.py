"""What is simulated: the model, the hardware, the plan, and the rank grid's links."""
