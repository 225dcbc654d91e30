"""Chapter 10: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # engine.backward returns the loss; float() instead of .item(); a tuple instead of a list
    "10.1": '''
out = []
for batch in batches:
    loss = engine.backward(engine(*batch)[1])
    engine.step()
    out.append(float(loss))
return tuple(out)
''',
    # numpy: the boundary flags as an array, the step count as a float
    "10.2": '''
import numpy as np
return (np.arange(n) + 1) % gas == 0, float(n // gas)
''',
}

WRONG = {
    # each rank takes one contiguous block for all its micro-steps: every row once, but not the script's slices
    "10.3": '''
per = global_size // (world * gas)
return {(r, m): ((r * gas + m) * per, (r * gas + m + 1) * per) for r in range(world) for m in range(gas)}
''',
}
