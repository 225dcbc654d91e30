"""ch19's attention trial grades a tensor-parallel attention: Megatron's split passes on two ranks; the fused QKV
weight cut into contiguous blocks (q, k and v mixed) and the library's own split (refused inside the trial) fail."""
import pytest
import torch

import zero_ref
from course.labs import ch19
from zero_ref import comm
from zero_ref.parallel import mappings


def split_attention(x, qkv_w, qkv_b, proj_w, proj_b, n_heads, group=None, naive=False):
    r, t = comm.get_rank(group), comm.get_world_size(group)
    B, T, C = x.shape
    c = C // t
    if naive:
        w, b = qkv_w.chunk(t)[r], qkv_b.chunk(t)[r]
    else:
        rows = [slice(j * C + r * c, j * C + (r + 1) * c) for j in range(3)]
        w, b = torch.cat([qkv_w[s] for s in rows]), torch.cat([qkv_b[s] for s in rows])
    q, k, v = (mappings.copy_to_tp(x, group) @ w.T + b).split(c, dim=-1)
    heads, hd = n_heads // t, C // n_heads
    q, k, v = (u.view(B, T, heads, hd).transpose(1, 2) for u in (q, k, v))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, c)
    return mappings.reduce_from_tp(y @ proj_w[:, r * c:(r + 1) * c].T, group) + proj_b


def naive_split(*args):
    return split_attention(*args, naive=True)


def library_split(x, qkv_w, qkv_b, proj_w, proj_b, n_heads, group=None):
    from zero_ref.parallel import tensor
    return tensor.shard(qkv_w, 0, 0, 2, 3)


def passed(run):
    return all(r["out"] and all(r["grads"]) and r["calls"] == [{"all_reduce": 1}, {"all_reduce": 1}] for r in run)


@pytest.mark.slow
def test_megatrons_split_passes_and_a_mixed_qkv_split_fails():
    assert all(passed(run) for run in zero_ref.launch(ch19.attention_trial, 2, split_attention, timeout=300))
    assert not any(passed(run) for run in zero_ref.launch(ch19.attention_trial, 2, naive_split, timeout=300))


@pytest.mark.slow
def test_the_librarys_split_is_refused():
    with pytest.raises(Exception, match="builds the split itself"):
        zero_ref.launch(ch19.attention_trial, 2, library_split, timeout=300)
