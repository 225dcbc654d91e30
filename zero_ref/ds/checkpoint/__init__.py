"""``deepspeed.checkpoint``: the helper accelerate calls when it saves a ZeRO-3 model (``utils``)."""
