"""Gradient compression for data parallelism: fewer bytes per gradient all-reduce.

A *hook* replaces the bucket all-reduce of the data-parallel stage, as ``register_comm_hook``
does in PyTorch DDP: ``hook(bucket, group)`` must leave the **average** over ranks of
``bucket.flat_grad`` in place, identical on every rank. ``CompressedDataParallel`` is stage 0
(zero_ref.stages.ddp) with its bucket reduction handed to a hook:

    opt = CompressedDataParallel(model, PowerSGD(rank=2), adam=AdamConfig(lr=1e-3))
    opt.backward(loss); opt.step()

Hooks, from least to most lossy:

- ``CastCompression("fp16" | "bf16")``: divide by n, cast to 16 bits, all-reduce, cast back
  (torch's fp16_compress_hook). Half the bytes; the error is one 16-bit rounding per rank.
- ``OneBit()``: the compressed all-reduce of 1-bit Adam (Tang et al. 2021): each rank sends the
  signs of its gradient (1 bit each) and one scale; a rank averages its chunk of everyone's
  signs and sends that back as signs and a scale again. ~1/32 of the bytes.
- ``PowerSGD(rank=r)`` (Vogels et al. 2019): each matrix gradient M (n × m) becomes P = M·Q and
  Q = Mᵀ·P, all-reduced: r·(n + m) numbers instead of n·m. Vectors go uncompressed.

Sign and low-rank compression are biased: the part a step does not send is lost. *Error feedback*
keeps that part (``error = what we wanted to send − what was sent``) and adds it to the next
step's gradient, so nothing is lost, only delayed. The hooks run synchronously inside backward
(each needs the reduced result before it can update its error), so they do not overlap.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.precision import PRECISIONS
from zero_ref.stages.ddp import DataParallel


class CompressedDataParallel(DataParallel):
    """Data parallelism (stage 0) whose bucket all-reduce is ``hook(bucket, group)``.

    The first ``start_step`` optimizer steps reduce uncompressed: early gradients change fast and
    set Adam's second moment (torch's ``start_powerSGD_iter``, 1-bit Adam's ``freeze_step``)."""

    def __init__(self, module, hook, *, start_step: int = 0, **kwargs):
        if not callable(hook):
            raise TypeError(f"hook must be callable as hook(bucket, group), got {type(hook).__name__}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be an integer >= 0, got {start_step!r}")
        self.hook, self.start_step = hook, start_step
        super().__init__(module, **kwargs)

    def reduce_bucket(self, b) -> None:
        (self.hook if self.adam_steps >= self.start_step else allreduce_hook)(b, self.group)

    def grad_shards(self) -> list[torch.Tensor]:
        return [b.flat_grad.float() for b in self.buckets]  # the hook already averaged


def allreduce_hook(bucket, group) -> None:
    """The uncompressed baseline: fp32 (or the gradient's dtype) all-reduce, then ÷ n."""
    comm.all_reduce(bucket.flat_grad, group=group)
    bucket.flat_grad.div_(dist.get_world_size(group))


# ------------------------------------------------------------------ 16-bit communication

def cast_all_reduce_(tensor: torch.Tensor, dtype: torch.dtype, group=None) -> torch.Tensor:
    """Average ``tensor`` over ranks, sending it in ``dtype``; in place, returns it.

    Dividing before the cast keeps the fp16 sum of n gradients from overflowing (as torch does)."""
    half = tensor.div(dist.get_world_size(group)).to(dtype)
    comm.all_reduce(half, group=group)
    return tensor.copy_(half)


class CastCompression:
    """Hook: gradients travel in fp16 or bf16 (half the bytes of fp32)."""

    def __init__(self, dtype: str = "fp16"):
        if dtype not in ("fp16", "bf16"):
            raise ValueError(f"CastCompression: dtype must be 'fp16' or 'bf16', got {dtype!r}")
        self.dtype = PRECISIONS[dtype]

    def __call__(self, bucket, group) -> None:
        cast_all_reduce_(bucket.flat_grad, self.dtype, group)


# ------------------------------------------------------------------ 1-bit with error feedback

_BITS = 1 << torch.arange(8, dtype=torch.uint8)  # 1, 2, 4, ..., 128


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """1 bit per element (1 for x ≥ 0), 8 to a byte; ``x.numel()`` must divide by 8."""
    if x.numel() % 8:
        raise ValueError(f"pack_signs: numel {x.numel()} must divide by 8")
    return ((x >= 0).view(-1, 8).to(torch.uint8) * _BITS.to(x.device)).sum(1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor) -> torch.Tensor:
    """±1.0 per bit of ``packed`` (the inverse of ``pack_signs``): one lookup in a 256 × 8 table."""
    table = ((torch.arange(256).unsqueeze(1) & _BITS).ne(0).float() * 2 - 1).to(packed.device)
    return table[packed.long()].reshape(*packed.shape[:-1], -1)


def _compress(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(signs packed, scale) with scale = ‖x‖/√numel: the ±scale vector closest to x in norm."""
    return pack_signs(x), torch.linalg.vector_norm(x).reshape(1) / math.sqrt(x.numel())


class OneBit:
    """Hook: 1-bit compressed all-reduce with error feedback (DeepSpeed's ``compressed_allreduce``).

    Worker: x = grad + worker error → signs + scale; all-to-all sends chunk j of the signs to rank j,
    all-gather shares the scales. Server (each rank, for its chunk): average the n decoded chunks,
    add its server error, compress again; all-gather the signs and scales. Every rank decodes the
    same result. ``error_feedback=False`` drops both errors (plain signSGD-style averaging).
    """

    def __init__(self, error_feedback: bool = True):
        self.error_feedback = error_feedback
        self.worker_error: dict[int, torch.Tensor] = {}
        self.server_error: dict[int, torch.Tensor] = {}

    def __call__(self, bucket, group) -> None:
        g = bucket.flat_grad
        g.copy_(self.all_reduce(g.float(), bucket.index, group)[:g.numel()])

    def all_reduce(self, grad: torch.Tensor, key: int = 0, group=None) -> torch.Tensor:
        """The average of ``grad`` over ranks, 1 bit per element each way (padded to 8·n)."""
        n = dist.get_world_size(group)
        padded = -(-grad.numel() // (8 * n)) * 8 * n
        x = torch.zeros(padded, device=grad.device)
        x[:grad.numel()] = grad
        chunk = padded // n
        if self.error_feedback:
            x += self.worker_error.get(key, 0)
        signs, scale = _compress(x)
        if self.error_feedback:
            self.worker_error[key] = x - scale * unpack_signs(signs)
        recv, scales = torch.empty_like(signs), torch.empty(n, device=x.device)
        comm.all_to_all(recv, signs, group=group)
        comm.all_gather(scales, scale, group=group)
        mine = (unpack_signs(recv.view(n, chunk // 8)) * scales.unsqueeze(1)).mean(0)  # my chunk, averaged
        if self.error_feedback:
            mine += self.server_error.get(key, 0)
        s_signs, s_scale = _compress(mine)
        if self.error_feedback:
            self.server_error[key] = mine - s_scale * unpack_signs(s_signs)
        all_signs, all_scales = torch.empty_like(signs), torch.empty(n, device=x.device)
        comm.all_gather(all_signs, s_signs, group=group)
        comm.all_gather(all_scales, s_scale, group=group)
        return (unpack_signs(all_signs.view(n, chunk // 8)) * all_scales.unsqueeze(1)).reshape(-1)


def onebit_bytes(numel: int, world_size: int) -> dict[str, int]:
    """Payload bytes one rank hands to each collective of ``OneBit.all_reduce`` for ``numel`` fp32 elements.

    (Recorded as comm does: an all-to-all by its input, an all-gather by its full output.)"""
    padded = -(-numel // (8 * world_size)) * 8 * world_size
    return {"all_to_all": padded // 8, "all_gather": padded // 8 + 2 * 4 * world_size}


# ------------------------------------------------------------------ PowerSGD

def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float = 2.0) -> bool:
    """torch's rule: compress a matrix when n·m > min_compression_rate · r·(n + m)."""
    return rows * cols > min_compression_rate * rank * (rows + cols)


class PowerSGD:
    """Hook: rank-``rank`` PowerSGD with error feedback and warm start (torch's powerSGD_hook).

    Per bucket: matrices worth compressing (``should_compress``) send P = M·Q (n × r) and
    Q = Mᵀ·P̂ (m × r), P̂ the orthonormalised all-reduced P, each all-reduced in one batch; the
    rest (vectors, small matrices) goes in one plain all-reduce. The result is P̂·Q̄ᵀ, the average
    gradient projected on r directions. Q persists from step to step (one power iteration per
    step refines it); every rank starts it from the same ``seed``.
    """

    def __init__(self, rank: int = 1, error_feedback: bool = True, min_compression_rate: float = 2.0, seed: int = 0):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD: rank must be a positive integer, got {rank!r}")
        self.rank, self.error_feedback, self.rate, self.seed = rank, error_feedback, min_compression_rate, seed
        self.q: dict[tuple, torch.Tensor] = {}
        self.error: dict[tuple, torch.Tensor] = {}

    def split(self, shapes) -> tuple[list[int], list[int]]:
        """Indices of the tensors it compresses and of those it sends as they are."""
        big = [i for i, s in enumerate(shapes)
               if len(s) >= 2 and should_compress(s[0], math.prod(s[1:]), self.rank, self.rate)]
        return big, [i for i in range(len(shapes)) if i not in big]

    def __call__(self, bucket, group) -> None:
        n = dist.get_world_size(group)
        grads = bucket.layout.unflatten(bucket.flat_grad)
        big, small = self.split([g.shape for g in grads])
        if small:
            flat = torch.cat([grads[i].reshape(-1).float() for i in small])
            comm.all_reduce(flat, group=group)
            for i, part in zip(small, flat.div_(n).split([grads[i].numel() for i in small])):
                grads[i].copy_(part.view_as(grads[i]))
        if not big:
            return
        keys = [(bucket.index, i) for i in big]
        ms = [grads[i].reshape(grads[i].shape[0], -1).float() for i in big]
        if self.error_feedback:
            ms = [m + self.error[k] if k in self.error else m for m, k in zip(ms, keys)]
        qs = [self._q(k, m.shape[1], min(self.rank, *m.shape), m.device) for k, m in zip(keys, ms)]
        ps = [m @ q for m, q in zip(ms, qs)]
        flat = torch.cat([p.reshape(-1) for p in ps])
        comm.all_reduce(flat, group=group)
        # orthonormal columns (the all-reduced P is the same on every rank, so is this)
        ps = [torch.linalg.qr(p.view_as(p0))[0] for p, p0 in zip(flat.split([p.numel() for p in ps]), ps)]
        qs = [m.t() @ p for m, p in zip(ms, ps)]
        flat = torch.cat([q.reshape(-1) for q in qs])
        comm.all_reduce(flat, group=group)
        qs = [q.view_as(q0) for q, q0 in zip(flat.div_(n).split([q.numel() for q in qs]), qs)]
        for k, i, m, p, q in zip(keys, big, ms, ps, qs):
            approx = p @ q.t()
            if self.error_feedback:
                self.error[k] = m - approx          # this rank's compensated gradient minus what all ranks got
            self.q[k] = q                           # warm start: next step's power iteration begins here
            grads[i].copy_(approx.view_as(grads[i]))

    def _q(self, key, cols: int, r: int, device) -> torch.Tensor:
        if key not in self.q:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + key[0] * 1009 + key[1])
            self.q[key] = torch.randn(cols, r, generator=gen).to(device)
        return self.q[key]

    def bytes_per_step(self, shapes, element_size: int = 4) -> dict[str, int]:
        """Payload bytes of one bucket's all-reduces: {"P", "Q", "uncompressed"}."""
        big, small = self.split(shapes)
        rows = [(s[0], math.prod(s[1:])) for s in (shapes[i] for i in big)]
        r = [min(self.rank, a, b) for a, b in rows]
        return {"P": sum(a * k for (a, _), k in zip(rows, r)) * element_size,
                "Q": sum(b * k for (_, b), k in zip(rows, r)) * element_size,
                "uncompressed": sum(math.prod(shapes[i]) for i in small) * element_size}


# ------------------------------------------------------------------ data with something to learn

def markov_batch(cfg, batch_size: int, seed: int = 0, successors: int = 4):
    """``(idx, targets)`` from a fixed random Markov chain: each token is followed by one of
    ``successors`` tokens (chosen once, from seed 0), uniformly. Unlike uniform random tokens
    there is something to learn; the best possible loss is ln(successors). Convergence
    comparisons draw a fresh batch per step (``seed`` = step)."""
    chain = torch.Generator().manual_seed(0)
    nxt = torch.stack([torch.randperm(cfg.vocab_size, generator=chain)[:successors] for _ in range(cfg.vocab_size)])
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(batch_size, cfg.seq_len + 1, dtype=torch.long)
    x[:, 0] = torch.randint(0, cfg.vocab_size, (batch_size,), generator=g)
    for t in range(cfg.seq_len):
        x[:, t + 1] = nxt[x[:, t], torch.randint(0, successors, (batch_size,), generator=g)]
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()
