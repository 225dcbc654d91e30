"""Chapter 15: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the ceiling written as (values + tp − 1) // tp, the bytes as a float
    "15.1": '''
values = seq * batch * hidden
per_rank = (values + tp - 1) // tp if partitioned else values
return float(layers * per_rank * bytes_per_value)
''',
}

WRONG = {
    # the attention scores' 5·a·s²·b bytes forgotten: too few layers checkpointed
    "15.2": '''
sbh = seq * batch * hidden
full, none = 2 * sbh, 34 * sbh
for k in range(layers + 1):
    if k * full + (layers - k) * none <= budget_bytes:
        return k
return None
''',
}
