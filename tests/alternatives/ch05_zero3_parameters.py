"""Chapter 5: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # exact rational arithmetic, the three equal entries built by one comprehension
    "5.1": '''
from fractions import Fraction
each = Fraction(n - 1, n) * psi * bytes_per_param
return {key: each for key in ("forward all_gather", "backward all_gather", "reduce_scatter")}
''',
}

WRONG = {
    # every rank writes its shard into a zero buffer and all-reduces it: the right values, but twice the
    # traffic of an all-gather (an all-reduce sends 2(N-1)/N of the buffer)
    "5.2": '''
import torch.distributed as dist
full = part.new_zeros(world_size * part.numel())
rank = dist.get_rank()
full[rank * part.numel():(rank + 1) * part.numel()] = part
comm.all_reduce(full)
return full
''',
}
