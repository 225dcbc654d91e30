"""Chapter 20: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # run the schedule as a loop over two queues; ops as lists, not tuples
    "20.1": '''
forwards = [["F", i, 0] for i in range(m)]
backwards = [["B", i, 0] for i in range(m)]
f = min(p - s - 1, m)
ops = forwards[:f]
for b in range(m):
    if f < m:
        ops.append(forwards[f])
        f += 1
    ops.append(backwards[b])
return ops
''',
}

WRONG = {
    # forgets that a stage never holds more micro-batches than the step has
    "20.2": '''
if schedule == "gpipe":
    return m
if schedule == "1f1b":
    return p - s
return 2 * (p - s - 1) + (v - 1) * p + 1
''',
}
