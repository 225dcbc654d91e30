"""Chapter 6: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # math.ceil and float bytes per element, returned as a list
    "6.1": '''
import math
element = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}[precision]
shard = math.ceil(num_params / world_size) * element
return [shard if stage == 1 else gas * shard, shard]
''',
}

WRONG = {
    # the master and the moments step on the host, but the 16-bit copy on the device is never updated
    "6.2": '''
adam_step_(master, grad16.float(), exp_avg, exp_avg_sq, step, cfg)
''',
}
