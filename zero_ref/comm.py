"""The communication layer: every collective and point-to-point call in zero_ref goes through here.

Each function is a thin wrapper over the ``torch.distributed`` call of the same idea, works on any
backend (gloo on CPU, NCCL on CUDA), checks shapes with a clear error, and — inside
``with recording() as log:`` — appends one ``CommRecord`` per call on this rank, so chapters
*measure* communication volume instead of asserting it:

    with comm.recording() as log:
        comm.all_reduce(grad)
    log.total_bytes()        # payload bytes this rank handed to collectives
    log.total_wire_bytes()   # bytes this rank sends under ring algorithms (the ZeRO paper's count)
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from zero_ref import clean_exit  # noqa: F401  (at exit, waits for gloo's workers: see there)

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT, "avg": dist.ReduceOp.SUM}  # avg = sum, then ÷ n (gloo has no AVG)
# torch 2.13 names the one-buffer collectives *_single and deprecates *_tensor / *_into_tensor;
# older torch (the 2.11 of a GPU image, say) has only the old names.
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def ring_wire_bytes(op: str, nbytes: int, group_size: int) -> float:
    """Bytes one rank sends for a collective whose full buffer is ``nbytes``, with ring algorithms.

    all_reduce = reduce-scatter + all-gather: 2(n−1)/n·S; reduce_scatter and all_gather: (n−1)/n·S
    (S = the full, unsharded buffer); all_to_all: (n−1)/n·S (keeps its own chunk); broadcast
    (pipelined ring): S; send: S; recv and barrier: 0.
    """
    n = group_size
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
              "all_to_all": (n - 1) / n, "broadcast": 1.0 if n > 1 else 0.0, "send": 1.0,
              "recv": 0.0, "barrier": 0.0}
    if op not in factor:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(factor)}")
    return factor[op] * nbytes


@dataclass(frozen=True)
class CommRecord:
    """One call on this rank: the op, its group size, and the full buffer's elements and bytes (and, for a
    point-to-point call, the other rank)."""

    op: str
    group_size: int
    numel: int
    bytes: int
    dtype: str
    peer: int | None = field(default=None, repr=False)

    @property
    def wire_bytes(self) -> float:
        return ring_wire_bytes(self.op, self.bytes, self.group_size)


@dataclass
class CommLog:
    """The calls one rank made while recording."""

    records: list[CommRecord] = field(default_factory=list)

    def total_bytes(self, op: str | None = None) -> int:
        return sum(r.bytes for r in self.records if op in (None, r.op))

    def total_wire_bytes(self, op: str | None = None) -> float:
        return sum(r.wire_bytes for r in self.records if op in (None, r.op))

    def by_op(self) -> dict[str, dict[str, float]]:
        """{op: {"calls", "bytes", "wire_bytes"}} in first-call order."""
        out: dict[str, dict[str, float]] = {}
        for r in self.records:
            row = out.setdefault(r.op, {"calls": 0, "bytes": 0, "wire_bytes": 0.0})
            row["calls"] += 1
            row["bytes"] += r.bytes
            row["wire_bytes"] += r.wire_bytes
        return out


_logs: list[CommLog] = []  # the active recordings of this process (nested recordings all see a call)


@contextmanager
def recording():
    """Record every call this rank makes through this module inside the block."""
    log = CommLog()
    _logs.append(log)
    try:
        yield log
    finally:
        _logs.remove(log)


_hooks: list = []  # callables (op, tensor, group) run before every call: zero_ref.diagnostics' watchdog


@contextmanager
def hooked(hook):
    """Call ``hook(op, tensor, group)`` before every call this rank makes through this module inside the block."""
    _hooks.append(hook)
    try:
        yield hook
    finally:
        _hooks.remove(hook)


def record(op: str, tensor: torch.Tensor | None, group, peer: int | None = None) -> None:
    """Run the hooks and append one ``CommRecord`` to every active recording (each collective calls this)."""
    for hook in _hooks:
        hook(op, tensor, group)
    if _logs:
        numel, nbytes = (0, 0) if tensor is None else (tensor.numel(), tensor.numel() * tensor.element_size())
        rec = CommRecord(op, dist.get_world_size(group), numel, nbytes,
                         "" if tensor is None else str(tensor.dtype).removeprefix("torch."), peer)
        for log in _logs:
            log.records.append(rec)


ReduceOp = dist.ReduceOp  # deepspeed.comm.ReduceOp's members by name: SUM, AVG, MAX, MIN, PRODUCT
_NAMES = {ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
          ReduceOp.PRODUCT: "product"}


def _op_name(op) -> str:
    """'sum', ... from a name or a ReduceOp (DeepSpeed's scripts pass ``ReduceOp.SUM``)."""
    if not isinstance(op, str):
        name = getattr(op, "name", None)  # deepspeed.comm.ReduceOp (an Enum) or torch's RedOpType
        op = _NAMES.get(op, name.lower() if isinstance(name, str) else op)
    return op


def _reduce_op(op: str):
    op = _op_name(op)
    if op not in _OPS:
        raise ValueError(f"op must be one of {', '.join(_OPS)}, got {op!r}")
    return _OPS[op]


def _check_avg(op: str, async_op: bool) -> None:
    # Checked before the collective is issued: raising after it would leave the peers' call unmatched.
    _reduce_op(op)
    if op == "avg" and async_op:
        raise ValueError("op='avg' is not supported with async_op=True; reduce with 'sum' and divide")


def _check_split(kind: str, small: torch.Tensor, big: torch.Tensor, n: int) -> None:
    if big.numel() != small.numel() * n:
        raise ValueError(f"{kind}: the full tensor must have world_size × the shard's elements; got "
                         f"{tuple(big.shape)} ({big.numel()}) vs shard {tuple(small.shape)} ({small.numel()}) "
                         f"with world_size {n}")
    if big.dtype != small.dtype:
        raise ValueError(f"{kind}: dtypes differ ({big.dtype} vs {small.dtype})")


def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, async_op: bool = False):
    """In place: every rank ends with the reduction of all ranks' ``tensor``."""
    op = _op_name(op)
    _check_avg(op, async_op)
    record("all_reduce", tensor, group)
    work = dist.all_reduce(tensor, op=_reduce_op(op), group=group, async_op=async_op)
    if op == "avg":
        tensor.div_(dist.get_world_size(group))
    return work


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: str = "sum", group=None, async_op: bool = False):
    """Reduce ``input`` over ranks; rank r keeps chunk r (``output`` = 1/n of ``input``). ``input`` may be
    DeepSpeed's list of n chunks (chunk r for rank r)."""
    op, n = _op_name(op), dist.get_world_size(group)
    if isinstance(input, (list, tuple)):  # end to end, the chunks are the full buffer
        input = torch.cat([t.reshape(-1) for t in input])
    if not output.is_contiguous():
        raise ValueError("reduce_scatter: the output must be contiguous (it receives the reduced chunk in place)")
    _check_split("reduce_scatter", output, input, n)
    _check_avg(op, async_op)
    record("reduce_scatter", input, group)
    work = _reduce_scatter_single(output.view(-1), input.reshape(-1), op=_reduce_op(op), group=group,
                                  async_op=async_op)
    if op == "avg":
        output.div_(n)
    return work


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """Concatenate every rank's ``input`` into ``output`` (rank order), on every rank. ``output`` may be
    DeepSpeed's (and torch's) list of n tensors, one per rank."""
    if isinstance(output, (list, tuple)):
        # the full buffer's size and dtype for the record, without allocating it
        record("all_gather", torch.empty(len(output) * input.numel(), dtype=input.dtype, device="meta"), group)
        return dist.all_gather(list(output), input, group=group, async_op=async_op)
    _check_split("all_gather", input, output, dist.get_world_size(group))
    record("all_gather", output, group)
    return _all_gather_single(output, input, group=group, async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False):
    """Copy rank ``src``'s ``tensor`` to every rank (``src`` is a global rank)."""
    record("broadcast", tensor, group)
    return dist.broadcast(tensor, src=src, group=group, async_op=async_op)


def all_to_all(output: torch.Tensor, input: torch.Tensor, output_split_sizes=None, input_split_sizes=None,
               group=None, async_op: bool = False):
    """Rank r sends chunk j of ``input`` to rank j and receives rank j's chunk r into ``output``."""
    n = dist.get_world_size(group)
    for name, t, splits in (("input", input, input_split_sizes), ("output", output, output_split_sizes)):
        if splits is None and t.shape[0] % n:
            raise ValueError(f"all_to_all: {name} dim 0 ({t.shape[0]}) must divide by world_size {n} "
                             f"or {name}_split_sizes must be given")
        if splits is not None and (len(splits) != n or sum(splits) != t.shape[0]):
            raise ValueError(f"all_to_all: {name}_split_sizes {list(splits)} must have {n} entries summing "
                             f"to dim 0 ({t.shape[0]})")
    record("all_to_all", input, group)
    return dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group,
                                  async_op=async_op)


def send(tensor: torch.Tensor, dst: int, group=None) -> None:
    """Blocking point-to-point send to global rank ``dst``."""
    record("send", tensor, group, dst)
    dist.send(tensor, dst=dst, group=group)


def recv(tensor: torch.Tensor, src: int, group=None) -> None:
    """Blocking point-to-point receive from global rank ``src`` into ``tensor``."""
    record("recv", tensor, group, src)
    dist.recv(tensor, src=src, group=group)


def isend(tensor: torch.Tensor, dst: int, group=None):
    """Non-blocking send; returns a work handle to ``wait()`` on."""
    record("send", tensor, group, dst)
    return dist.isend(tensor, dst=dst, group=group)


def irecv(tensor: torch.Tensor, src: int, group=None):
    """Non-blocking receive; returns a work handle to ``wait()`` on."""
    record("recv", tensor, group, src)
    return dist.irecv(tensor, src=src, group=group)


def barrier(group=None) -> None:
    """Wait until every rank of the group arrives."""
    record("barrier", None, group)
    dist.barrier(group=group)


# ---------------------------------------------------------------- torch.distributed's queries
def is_initialized() -> bool:
    return dist.is_initialized()


def is_available() -> bool:
    return dist.is_available()


def get_rank(group=None) -> int:
    return dist.get_rank(group)


def get_world_size(group=None) -> int:
    return dist.get_world_size(group)


def new_group(ranks):
    return dist.new_group(ranks)


def destroy_process_group(group=None) -> None:
    dist.destroy_process_group(group)
