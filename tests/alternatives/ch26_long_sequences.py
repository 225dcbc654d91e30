"""Chapter 26: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # the quadratic solved in closed form, then snapped to the grid of multiples (a float result)
    "26.2": '''
import math

def per_layer(s):
    sbh = s * hidden
    if recompute == "full":
        return 2 * sbh / (tp if sp else 1)
    scores = 5 * heads * s * s if recompute == "none" else 0
    return (34 * sbh + scores) / tp if sp else 10 * sbh + (24 * sbh + scores) / tp

# layers · (q·s² + l·s) ≤ budget, with q the score term and l the linear one per token
if recompute == "full":
    q, lin = 0.0, 2 * hidden / (tp if sp else 1)
else:
    q = 5 * heads / tp if recompute == "none" else 0.0
    lin = 34 * hidden / tp if sp else 10 * hidden + 24 * hidden / tp
c = budget_bytes / layers
s_max = c / lin if q == 0 else (-lin + math.sqrt(lin * lin + 4 * q * c)) / (2 * q)
s = float(multiple * math.floor(s_max / multiple))
while s > 0 and layers * per_layer(s) > budget_bytes:    # float rounding at the edge
    s -= multiple
while layers * per_layer(s + multiple) <= budget_bytes:
    s += multiple
return s
''',
}

WRONG = {
    # the linear part counted as the 24·sbh that tensor parallelism splits, the replicated 10·sbh left out
    "26.1": '''
return 24 * hidden / (5 * heads)
''',
}
