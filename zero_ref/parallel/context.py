"""Context parallelism, the arithmetic: which tokens a rank holds and how many bytes each method moves.

Torch-free, so the simulator prices the same counts the real implementations send
(``ring_attention`` and ``ulysses`` beside this file).

**Zig-zag split** (Megatron's context parallelism, Liu et al.'s striped variant). Causal attention
makes late tokens expensive (token i attends to i + 1 keys), so cutting the sequence into cp equal
runs would leave the last rank with the most work. Instead the sequence is cut into 2·cp chunks
and rank r holds chunks r and 2·cp − 1 − r: one early and one late chunk, the same work on every
rank. With cp = 2 and 8 tokens:

    chunks   [0 1] [2 3] [4 5] [6 7]
    rank 0:  chunks 0 and 3  -> tokens 0 1 6 7
    rank 1:  chunks 1 and 2  -> tokens 2 3 4 5

**Bytes per attention layer on one rank** (b sequences of s tokens, kv_heads × head_dim for K and V,
heads × head_dim for Q and the output, ``element_size`` bytes each):

    ring     forward   (cp − 1) sends of this rank's K and V block: (cp − 1) · 2·b·(s/cp)·kv·d·e
             backward  the K/V block goes round again (cp − 1 sends) and its gradient dK, dV
                       travels with it and one step further, home (cp sends): (2cp − 1) · 2·b·(s/cp)·kv·d·e
    ulysses  forward   all-to-alls of Q, K, V (sequence → head shards) and of the output (back):
                       b·(s/cp)·(2·heads + 2·kv)·d·e handed to all-to-all, of which (cp − 1)/cp leaves the rank
             backward  the same four all-to-alls on the gradients
"""
from __future__ import annotations


def _check(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def zigzag_chunks(cp: int, rank: int) -> tuple[int, int]:
    """The two of the 2·cp sequence chunks rank ``rank`` holds: (rank, 2·cp − 1 − rank)."""
    _check("cp", cp)
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is not in a context-parallel group of {cp}")
    return rank, 2 * cp - 1 - rank


def zigzag_positions(seq: int, cp: int, rank: int) -> list[int]:
    """Global token positions rank ``rank`` holds, in its local order (early chunk, then late chunk)."""
    check_zigzag(seq, cp)
    c = seq // (2 * cp)
    return [i for chunk in zigzag_chunks(cp, rank) for i in range(chunk * c, (chunk + 1) * c)]


def check_zigzag(seq: int, cp: int) -> None:
    """The zig-zag split needs 2·cp equal chunks: seq % (2·cp) == 0."""
    _check("seq", seq)
    _check("cp", cp)
    if seq % (2 * cp):
        raise ValueError(f"sequence length {seq} must divide by 2·cp = {2 * cp} for the zig-zag split (cp = {cp})")


def check_ulysses(heads: int, cp: int, kv_heads: int | None = None) -> None:
    """Ulysses gives each rank heads/cp whole heads: heads (and kv_heads) must divide by cp."""
    _check("heads", heads)
    _check("cp", cp)
    for name, n in (("heads", heads), ("kv_heads", kv_heads)):
        if n is not None and n % cp:
            raise ValueError(f"Ulysses: {name} = {n} is not divisible by the sequence-parallel degree cp = {cp}")


def ring_bytes(batch: int, seq: int, kv_heads: int, head_dim: int, cp: int, element_size: int = 2) -> dict:
    """{'forward', 'backward'}: bytes one rank sends per attention layer under ring attention."""
    block = 2 * batch * (seq // cp) * kv_heads * head_dim * element_size      # this rank's K and V
    return {"forward": (cp - 1) * block, "backward": (2 * cp - 1) * block if cp > 1 else 0}


def ulysses_bytes(batch: int, seq: int, heads: int, head_dim: int, cp: int, element_size: int = 2,
                  kv_heads: int | None = None) -> dict:
    """{'forward', 'backward'}: bytes one rank hands to all-to-all per attention layer under Ulysses
    (the wire share is (cp − 1)/cp of it, ``zero_ref.comm.ring_wire_bytes``)."""
    kv = heads if kv_heads is None else kv_heads
    per_pass = batch * (seq // cp) * (2 * heads + 2 * kv) * head_dim * element_size if cp > 1 else 0
    return {"forward": per_pass, "backward": per_pass}
