"""Chapter 7: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # math.ceil, the bytes per element as one sum, a list instead of a tuple
    "7.2": '''
import math
shard = math.ceil(num_params / world_size)
element = 4 if precision == "fp32" else 2
return [(12 + 2 * element * offload_param) * shard, (12 + element * offload_param) * shard]
''',
}

WRONG = {
    # reads and writes on two separate queues: a write never delays the next read
    "7.1": '''
reads_free = writes_free = cpu = 0.0
out = []
ready = read[0]
reads_free = ready
for i in range(len(read)):
    cpu = max(cpu, ready)
    if i + 1 < len(read):
        reads_free = max(cpu, reads_free) + read[i + 1]
        ready = reads_free
    out.append((cpu, cpu + step[i]))
    cpu += step[i]
    writes_free = max(cpu, writes_free) + write[i]
return out
''',
}
