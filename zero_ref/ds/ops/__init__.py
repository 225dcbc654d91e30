"""DeepSpeed's ``deepspeed.ops`` names that training scripts construct: ``ops.adam`` (FusedAdam, DeepSpeedCPUAdam),
``ops.adagrad`` (DeepSpeedCPUAdagrad) and ``ops.lion`` (FusedLion, DeepSpeedCPULion)."""
