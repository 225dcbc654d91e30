"""All-reduce spelled out in point-to-point messages: the ring and the binomial tree (chapter 17).

gloo and NCCL implement their collectives inside the library. Here the two classic algorithms are
written with ``zero_ref.comm``'s send and receive, so every step and every byte a rank sends is
visible (and counted inside ``comm.recording()``):

- ``ring_all_reduce_`` = ``ring_reduce_scatter_`` + ``ring_all_gather_``. The buffer is cut into n
  chunks (``tensor_split``: sizes differ by at most one element). Reduce-scatter: at step k
  (0 ≤ k < n−1) rank r sends chunk (r − k) mod n to rank r + 1 and adds the chunk (r − k − 1) mod n
  it receives from rank r − 1; after n − 1 steps rank r holds the full sum of chunk (r + 1) mod n.
  All-gather passes the finished chunks n − 1 more steps around the ring. Each rank sends every
  chunk but one in each half: 2(n−1)/n · S bytes when n divides the buffer, whatever n is, in
  2(n − 1) steps.
- ``tree_all_reduce_``: a binomial tree. Reduce: in round d = 1, 2, 4, … rank r with r mod 2d = d
  sends its whole partial sum to rank r − d, which adds it; rank 0 ends with the total after
  ⌈log2 n⌉ rounds. Broadcast retraces the rounds backwards. 2⌈log2 n⌉ steps, but each step moves
  the whole buffer: latency-cheap, bandwidth-expensive (rank 0 sends ⌈log2 n⌉ · S).

Ranks are those of the default group. Every rank must call with a tensor of the same shape.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from zero_ref import comm


def _ring(tensor: torch.Tensor) -> tuple[int, int, list[torch.Tensor]]:
    if not tensor.is_contiguous():
        raise ValueError("ring collectives need a contiguous tensor (they work on views of its chunks)")
    n, r = dist.get_world_size(), dist.get_rank()
    return n, r, list(tensor.view(-1).tensor_split(n))


def _exchange(send: torch.Tensor, recv: torch.Tensor, n: int, r: int) -> None:
    """Send to the next rank and receive from the previous one, at the same time (no deadlock)."""
    work = comm.isend(send, dst=(r + 1) % n)
    comm.irecv(recv, src=(r - 1) % n).wait()
    work.wait()


def ring_reduce_scatter_(tensor: torch.Tensor) -> int:
    """In place, n − 1 ring steps; returns the chunk index this rank now holds summed: (rank + 1) mod n.
    The other chunks hold partial sums."""
    n, r, chunks = _ring(tensor)
    if n == 1:
        return 0
    buf = torch.empty_like(chunks[0])
    for k in range(n - 1):
        send, recv = chunks[(r - k) % n], chunks[(r - k - 1) % n]
        incoming = buf[:recv.numel()]
        _exchange(send, incoming, n, r)
        recv.add_(incoming)
    return (r + 1) % n


def ring_all_gather_(tensor: torch.Tensor, owned: int) -> None:
    """In place, n − 1 ring steps: starting with chunk ``owned`` = (rank + 1) mod n complete on each
    rank, every chunk ends complete on every rank."""
    n, r, chunks = _ring(tensor)
    if owned != (r + 1) % n:
        raise ValueError(f"rank {r} must own chunk {(r + 1) % n} of {n} (what ring_reduce_scatter_ leaves), got {owned}")
    for k in range(n - 1):
        _exchange(chunks[(r + 1 - k) % n], chunks[(r - k) % n], n, r)


def ring_all_reduce_(tensor: torch.Tensor) -> torch.Tensor:
    """In place: every rank ends with the sum over ranks. Reduce-scatter, then all-gather."""
    ring_all_gather_(tensor, ring_reduce_scatter_(tensor))
    return tensor


def tree_all_reduce_(tensor: torch.Tensor) -> torch.Tensor:
    """In place: binomial-tree reduce to rank 0, then broadcast back down the same tree."""
    n, r = dist.get_world_size(), dist.get_rank()
    rounds = [1 << i for i in range(math.ceil(math.log2(n)))] if n > 1 else []
    buf = torch.empty_like(tensor)
    for d in rounds:                      # reduce: children send up, parents add
        if r % (2 * d) == d:
            comm.send(tensor, dst=r - d)
        elif r % (2 * d) == 0 and r + d < n:
            comm.recv(buf, src=r + d)
            tensor.add_(buf)
    for d in reversed(rounds):            # broadcast: parents send down
        if r % (2 * d) == 0 and r + d < n:
            comm.send(tensor, dst=r + d)
        elif r % (2 * d) == d:
            comm.recv(tensor, src=r - d)
    return tensor


def ring_steps(n: int) -> int:
    """Message steps of a ring all-reduce on n ranks: 2(n − 1)."""
    return 2 * (n - 1)


def tree_steps(n: int) -> int:
    """Message steps of a binomial-tree all-reduce on n ranks: 2⌈log2 n⌉."""
    return 2 * math.ceil(math.log2(n)) if n > 1 else 0


def ring_send_bytes(numel: int, n: int, rank: int, itemsize: int = 4) -> int:
    """Bytes rank ``rank`` sends in ``ring_all_reduce_`` of ``numel`` elements: every chunk but
    (rank + 1) mod n in the reduce-scatter and every chunk but (rank + 2) mod n in the all-gather."""
    if n == 1:
        return 0
    sizes = _chunk_sizes(numel, n)
    return itemsize * (2 * numel - sizes[(rank + 1) % n] - sizes[(rank + 2) % n])


def _chunk_sizes(numel: int, n: int) -> list[int]:
    """Sizes of ``tensor_split(n)`` of ``numel`` elements: the first numel mod n chunks one larger."""
    q, extra = divmod(numel, n)
    return [q + (i < extra) for i in range(n)]
