"""What every ZeRO stage shares: buckets of flat parameters, the Adam step on a shard, the
micro-step / accumulation-boundary bookkeeping, loss scaling and gradient clipping.

A stage is an optimizer that owns the module's trainable parameters:

    opt = ZeroStage2(model, adam=AdamConfig(lr=1e-3), precision="bf16", gradient_accumulation_steps=2)
    for micro_batch in batches:
        loss = model(*micro_batch)
        opt.backward(loss)      # scales by 1/GAS (and the fp16 loss scale); reduces when due
        opt.step()              # steps only at the accumulation boundary; True if applied

Parameters are grouped into *buckets* of at most ``reduce_bucket_size`` elements, in reverse
registration order (the order backward usually produces gradients). Each bucket is one flat,
padded buffer (``FlatLayout``) that the parameters' ``.data`` view into; rank r owns shard r of
every bucket. Collectives are issued bucket by bucket in a fixed order, so every rank issues the
same sequence even if its gradients become ready in a different order.

What rank r owns of a bucket (fp32 master, both Adam moments, the reduced gradient shard, and
their range of the flat buffer) is one object, ``bucket.partition`` (``zero_ref.stages.partition``).
ZeRO-Offload and ZeRO-Infinity (``offload_optimizer``, ``offload_param``: DeepSpeed's config sections)
decide only where its tensors live, the host or NVMe: that code is in zero_ref/offload/, and the stages
call it at the few places marked "offload".

The Adam step on the partition is torch's arithmetic (``zero_ref.optim.adam_step_``: bit for bit
``torch.optim.AdamW``) unless ``adam_kernel`` names a fused kernel: ``"numba"`` on CPU ranks, ``"cuda"`` on
GPUs, one pass over the partition as DeepSpeed's default FusedAdam makes (``zero_ref.kernels``). Given a
torch optimizer (``optimizer=``: SGD, Adagrad, a user's own), the stage runs that optimizer's own step on
its partition instead, as DeepSpeed runs a client optimizer (``zero_ref.stages.client_optimizer``).

The accumulation rule in one sentence (nanoGPT's ``require_backward_grad_sync``): gradients are
reduced only in the backward of the last micro-step before a step, unless the stage keeps no full
gradient to accumulate into (stages 2–3 reduce every micro-step).

A stage is this class plus a few of its extension points, each a method a subclass overrides:

    extension point           called                            ddp  z1  z2  z3
    init_bucket(b, masters)   once per bucket, at set-up         ✓    ✓   ✓   ✓
    on_grad_ready(b, i, p)    when parameter i's gradient is in  -    -   ✓   ✓
    reduce_bucket(b)          once b's gradients are all in      ✓    ✓   ✓   ✓
    reduces_this_micro_step() at each backward                   -    -   ✓   ✓
    after_backward()          after every backward, even failed  -    -   -   ✓
    grads_are_sharded()       in step: norm needs a collective?  ✓    -   -   -
    grad_shards()             in step: the gradients Adam reads  ✓    ✓   ✓   ✓
    master_shard(b, ...)      in init_bucket: the fp32 weights   -    -   -   ✓
    publish_params()          after Adam: parameters everywhere  ✓    -   -   ✓
    clear_grads()             after a step or a skipped one      ✓    ✓   ✓   ✓

(✓: the stage defines its own; -: the base's default. Stages 2 and 3 both hand their gradients to one
``GradientShards``, zero_ref/stages/gradient_shards.py.)
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from zero_ref import comm, offload
from zero_ref.kernels import KERNELS, adam_update_
from zero_ref.optim import AdamConfig
from zero_ref.precision import PRECISIONS
from zero_ref.stages.client_optimizer import PartitionedOptimizer, client_groups
from zero_ref.stages.flat import FlatLayout
from zero_ref.stages.param_groups import group_adam, param_groups_for, trainable_params
from zero_ref.stages.partition import Partition


class Bucket:
    """A group of parameters laid end to end in one flat buffer, sharded over the group."""

    def __init__(self, index: int, params: list[nn.Parameter], world_size: int, rank: int):
        self.index, self.params, self.rank = index, params, rank
        self.layout = FlatLayout([p.shape for p in params], world_size)
        self.flat_param = self.layout.flatten([p.data for p in params])
        for p, view in zip(params, self.layout.unflatten(self.flat_param)):
            p.data = view  # the module now computes with views into the flat buffer
        self.ready: set[int] = set()  # indices of params whose gradient arrived this backward
        self.launched = False
        self.partition: Partition | None = None  # what this rank owns of it (the stage's init_bucket)
        self.flat_grad: torch.Tensor | None = None  # stages 0-1: the full gradient buffer, param.grad views into it
        self.grad_views: list[torch.Tensor] = []  # stages 0-1: each parameter's view into flat_grad

    def shard(self, flat: torch.Tensor) -> torch.Tensor:
        return self.layout.shard(flat, self.rank)

    @property
    def numel(self) -> int:
        return self.layout.numel


def make_buckets(params: list[nn.Parameter], bucket_size: int, world_size: int, rank: int) -> list[Bucket]:
    """Split ``params`` (in reverse order) into buckets of at most ``bucket_size`` elements;
    a parameter larger than that gets a bucket of its own."""
    groups, current, size = [], [], 0
    for p in reversed(params):
        if current and size + p.numel() > bucket_size:
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel()
    if current:
        groups.append(current)
    return [Bucket(i, g, world_size, rank) for i, g in enumerate(groups)]


class ZeroOptimizerBase:
    """Shared machinery; subclasses decide what is sharded and when gradients are reduced."""

    stage = -1
    MAX_IN_FLIGHT = 2  # reductions in flight: bounds the staging buffers alive during backward
    _reducing = False  # inside a backward that reduces (the gradient hooks act only then)
    _counts = False  # the backward under way counts as a micro-step (not an accumulate)
    _reduced = False  # the last backward reduced its gradients

    def __init__(self, module: nn.Module, *, adam: AdamConfig | None = None, precision: str = "fp32",
                 group=None, reduce_bucket_size: int = int(5e8), overlap_comm: bool = True,
                 gradient_accumulation_steps: int = 1, gradient_clipping: float = 0.0, loss_scaler=None,
                 offload_optimizer: dict | None = None, offload_param: dict | None = None, aio: dict | None = None,
                 sub_group_size: int = int(1e9), cpu_adam: str = "numba", param_groups: list[dict] | None = None,
                 adam_kernel: str = "torch", optimizer: torch.optim.Optimizer | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be a positive integer, got {gradient_accumulation_steps!r}")
        if reduce_bucket_size < 1:
            raise ValueError(f"reduce_bucket_size must be >= 1, got {reduce_bucket_size}")
        if gradient_clipping < 0:
            raise ValueError(f"gradient_clipping must be >= 0, got {gradient_clipping}")
        if adam_kernel not in KERNELS:
            raise ValueError(f"adam_kernel must be one of {', '.join(KERNELS)}, got {adam_kernel!r}")
        if precision == "fp16" and loss_scaler is None:
            raise ValueError("precision='fp16' needs a loss_scaler (see zero_ref.precision)")
        self.module, self.group = module, group
        self.adam = adam or AdamConfig()  # the defaults; each group's own values are in param_groups
        # ``optimizer``: a torch optimizer whose own step runs on the partitions instead of Adam
        # (zero_ref.stages.client_optimizer); its param groups are the stage's
        self.client_optimizer, self.client = optimizer, None
        self.param_groups, self._group_of = (param_groups_for(module, param_groups, self.adam) if optimizer is None
                                             else client_groups(module, optimizer))
        self.precision, self.dtype = precision, PRECISIONS[precision]
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.overlap_comm = overlap_comm
        self.gas = gradient_accumulation_steps
        self.clip = gradient_clipping
        self.adam_kernel = adam_kernel  # the device step's (the host's, under offload_optimizer: cpu_adam)
        self.loss_scaler = loss_scaler
        self.micro_steps = 0   # backward calls so far
        self.adam_steps = 0  # Adam steps applied: the bias-correction step (an fp16-skipped step is not one;
        # the engine's global_steps counts it, as DeepSpeed's does)
        self.skipped_steps = 0
        self.last_grad_norm: float | None = None
        self._pending: list = []  # (work handle, callback) of collectives in flight
        # ZeRO-Offload / ZeRO-Infinity (zero_ref.offload): None unless configured. DeepSpeed's config sections.
        device = next(module.parameters()).device
        self.offload, self.param_offload = offload.make(
            self.stage, device=device, offload_optimizer=offload_optimizer, offload_param=offload_param, aio=aio,
            sub_group_size=sub_group_size, cpu_adam=cpu_adam, rank=self.rank, world_size=self.world_size)
        if optimizer is not None and (self.offload is not None or self.param_offload is not None):
            raise ValueError(f"offload_optimizer / offload_param with {type(optimizer).__name__} is not supported by "
                             "zero_ref: its offload steps Adam on the host; use an Adam(W) optimizer "
                             "(DeepSpeedCPUAdam) there, or train this optimizer without offload")
        self.buckets = self._build(module, reduce_bucket_size)
        for b in self.buckets:  # which span of this rank's optimizer state each group's hyper-parameters step
            labels = [self._group_of[id(p)] for p in b.params]
            b.adam_runs = b.layout.runs(labels, None if self.stage == 0 else self.rank)
        if optimizer is not None:
            self.client = PartitionedOptimizer(optimizer, self)

    # ---------------------------------------------------------------- set-up
    def _build(self, module: nn.Module, bucket_size: int) -> list[Bucket]:
        params = trainable_params(module)
        if not params:
            raise ValueError("the module has no parameters with requires_grad=True")
        # Master weights in fp32 come from the module's values before they are cast down.
        masters = {id(p): p.detach().float().clone() for p in params} if self.precision != "fp32" else {}
        if self.precision != "fp32":
            module.to(self.dtype)
        buckets = make_buckets(params, bucket_size, self.world_size, self.rank)
        for b in buckets:
            self.init_bucket(b, masters)
        if self.offload is not None:
            self.offload.attach(self, buckets)
        for b in buckets:
            for i, p in enumerate(b.params):
                p.register_post_accumulate_grad_hook(self._make_hook(b, i))
        return buckets

    def master_shard(self, b: Bucket, masters: dict, full: bool) -> torch.Tensor:
        """The fp32 weights the optimizer updates: this rank's shard (or all of it, for stage 0)."""
        if not masters:  # fp32 training: the flat parameter buffer is its own master
            return b.flat_param if full else b.shard(b.flat_param)
        flat = b.layout.flatten([masters[id(p)] for p in b.params])
        return flat if full else b.shard(flat).clone()  # keep only our shard alive

    def init_bucket(self, b: Bucket, masters: dict) -> None:
        """Give ``b`` what this stage keeps of it: ``b.partition`` and any gradient buffer."""
        raise NotImplementedError

    def new_partition(self, b: Bucket, master: torch.Tensor, grad: bool) -> Partition:
        """This rank's ``Partition`` of ``b`` around ``master``: zeroed Adam moments (none for a client optimizer:
        it keeps its own state) and, if ``grad``, a zeroed gradient shard. With offload the offload decides where
        it lives (on the host, fp32 gradient included)."""
        start, end = (0, b.layout.padded_numel) if self.stage == 0 else b.layout.shard_range(self.rank)
        part = Partition(start, end, master, exp_avg=None, exp_avg_sq=None, grad=None)
        if self.offload is not None:
            self.offload.place(part)  # on the host
            return part
        if self.client_optimizer is None:
            part.exp_avg = torch.zeros(part.numel, dtype=torch.float32, device=master.device)
            part.exp_avg_sq = torch.zeros(part.numel, dtype=torch.float32, device=master.device)
        if grad:
            part.grad = torch.zeros(part.numel, dtype=self.dtype, device=master.device)
        return part

    @staticmethod
    def attach_flat_grad(b: Bucket) -> None:
        """Stages 0-1: one zeroed gradient buffer for ``b``; each ``param.grad`` is a view into it, so autograd
        accumulates there."""
        b.flat_grad = torch.zeros_like(b.flat_param)
        b.grad_views = b.layout.unflatten(b.flat_grad)
        for p, g in zip(b.params, b.grad_views):
            p.grad = g

    def adopt_module_grads(self) -> None:
        """Stages 0-1, before a backward: the gradient each parameter holds is what this backward adds to, as
        in DeepSpeed's stage 0, where gradients live in ``param.grad``. A script's ``module.zero_grad()`` sets
        ``param.grad`` to None (its slice is zeroed), and a backward outside the engine may have made a tensor
        of its own (its values are taken); either way ``param.grad`` is the view again."""
        for b in self.buckets:
            for p, view in zip(b.params, b.grad_views):
                g = p.grad
                if g is view:
                    continue
                if g is None:
                    view.zero_()
                else:
                    view.copy_(g)
                p.grad = view

    def take_held_grads(self) -> None:
        """Stages 2-3, at the end of a reducing backward: a gradient a parameter got outside the engine (another
        engine's backward through this module) and that this backward did not add to is reduced with it, as
        DeepSpeed's stage 0 reduces every ``param.grad`` at the boundary."""
        for b in self.buckets:
            if b.flat_grad is None and not b.launched:
                for i, p in enumerate(b.params):
                    if i not in b.ready and p.grad is not None:
                        b.ready.add(i)
                        self.on_grad_ready(b, i, p)

    def _make_hook(self, b: Bucket, i: int):
        def hook(param: torch.Tensor) -> None:
            if not self._reducing:
                return
            b.ready.add(i)
            self.on_grad_ready(b, i, param)
            self.launch_ready()
        return hook

    # ---------------------------------------------------------------- micro-step
    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale if self.loss_scaler is not None else 1.0

    def is_gradient_accumulation_boundary(self) -> bool:
        """True while the current (next) backward is the last micro-step before an optimizer step."""
        return (self.micro_steps + 1) % self.gas == 0

    def reduces_this_micro_step(self) -> bool:
        return self.is_gradient_accumulation_boundary()

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True,
                 again: bool = False, reduce: bool = True) -> None:
        """Backward of ``loss`` / GAS (times the loss scale), reducing gradients when due. ``retain_graph``
        and ``scale_wrt_gas=False`` (no division by GAS) are DeepSpeed's ``engine.backward`` arguments;
        ``again`` and ``reduce``: see ``begin_backward``."""
        if loss.dim() != 0:
            raise ValueError(f"backward expects a scalar loss, got shape {tuple(loss.shape)}")
        self.begin_backward(reduce, again)
        try:
            (loss * (self.loss_scale / (self.gas if scale_wrt_gas else 1))).backward(retain_graph=retain_graph)
        except BaseException:
            self.end_backward(failed=True)
            raise
        self.end_backward()

    def accumulate(self, loss: torch.Tensor) -> None:
        """Backward of ``loss`` / GAS into this rank's gradients only: no reduction, and no micro-step counted
        (the engine's ``no_sync()``). Stages 0–1 hold full gradients until the boundary's reduction, which then
        reduces these too; stages 2–3 partition gradients by reducing them, so they cannot wait."""
        self.backward(loss, reduce=False)

    # A backward in two halves, around autograd's pass: ``backward`` above runs one, and the engine runs
    # one around a ``loss.backward()`` the script calls itself (its hooks: zero_ref/ds/torch_backward.py).
    def begin_backward(self, reduce: bool = True, again: bool = False) -> None:
        """Before a backward's gradients arrive. ``reduce=False``: accumulate only (``accumulate``).
        ``again``: one more backward of the micro-step the last backward counted (the engine's several
        backwards per micro-batch): the same boundary, and gradients reduced already are reopened."""
        if not reduce and self.stage >= 2:
            raise RuntimeError(f"ZeRO stage {self.stage} reduces every micro-step's gradients to partition them; "
                               "it cannot accumulate without reducing (DeepSpeed's no_sync refuses stages 2 and 3 too)")
        self.adopt_module_grads()
        if again:
            self.micro_steps -= 1  # counted again at its end
            if self._reduced:
                self.reopen_reduced()
        self._counts = reduce  # a reducing backward is a micro-step
        self._reducing = reduce and self.reduces_this_micro_step()
        for b in self.buckets:
            b.ready.clear()
            b.launched = False

    def end_backward(self, failed: bool = False) -> None:
        """After autograd's pass: the reductions still due (parameters that got no gradient reduce zeros),
        then the micro-step is counted. ``failed``: autograd raised; release what the backward held."""
        try:
            if self._reducing and not failed:
                self.take_held_grads()
                self.launch_ready(flush=True)
                self._wait_all()
        finally:
            self._reduced = self._reducing and not failed
            self._reducing = False
            self.after_backward()
        if self._counts and not failed:
            self.micro_steps += 1

    def reopen_reduced(self) -> None:
        """Before another backward of a micro-step whose gradients were reduced already. Stages 0-1 reduce
        the full gradient buffer in place with a sum: each rank keeps that sum in its own shard only
        (zeros elsewhere), so the next reduction adds it exactly once to the new gradients. (Stages 2-3
        reduced into the gradient partition and stage each backward's gradients afresh.)"""
        for b in self.buckets:
            if b.flat_grad is not None:
                start, end = b.layout.shard_range(self.rank)
                b.flat_grad[:start].zero_()
                b.flat_grad[end:].zero_()

    def after_backward(self) -> None:
        """Called after every backward, even a failed one (ZeRO-3 releases gathered parameters here)."""

    def launch_ready(self, flush: bool = False) -> None:
        """Issue reductions in bucket order: bucket k only after buckets 0..k-1 (same order on every rank)."""
        for b in self.buckets:
            if b.launched:
                continue
            if not flush and len(b.ready) < len(b.params):
                return  # (without overlap_comm the collective below blocks, inside backward)
            b.launched = True
            self.reduce_bucket(b)

    def _async(self, work, callback=None) -> None:
        self._pending.append((work, callback))
        while len(self._pending) > self.MAX_IN_FLIGHT:
            self._finish(*self._pending.pop(0))

    @staticmethod
    def _finish(work, callback) -> None:
        if work is not None:
            work.wait()
        if callback is not None:
            callback()

    def _wait_all(self) -> None:
        for work, callback in self._pending:
            self._finish(work, callback)
        self._pending.clear()

    def on_grad_ready(self, b: Bucket, i: int, param: torch.Tensor) -> None:
        """Called when parameter i of bucket b has its gradient for this backward."""

    def reduce_bucket(self, b: Bucket) -> None:
        """Issue ``b``'s collective (in bucket order: ``launch_ready`` calls it); ``self._async(work, then)``
        keeps it in flight and runs ``then`` once it is done."""
        raise NotImplementedError

    # ---------------------------------------------------------------- step
    def state_dict(self) -> dict:
        """Refused, naming the way out: DeepSpeed's ZeRO-1/2 optimizer returns this rank's partition of the fp32
        master weights and optimizer state (runtime/zero/stage_1_and_2.py, ``DeepSpeedZeroOptimizer.state_dict``);
        zero_ref keeps that state in its checkpoints instead."""
        raise NotImplementedError(
            f"optimizer.state_dict() at ZeRO-{self.stage}: DeepSpeed's returns this rank's partition of the fp32 "
            "master weights and Adam state; zero_ref writes and reads every rank's partition with "
            "engine.save_checkpoint(dir) / engine.load_checkpoint(dir) (zero_ref.checkpoint), so use those")

    def load_state_dict(self, state_dict: dict) -> None:
        self.state_dict()  # the same refusal and the same way out

    def step(self) -> bool:
        """At the accumulation boundary: unscale, check overflow, clip, Adam, share parameters.

        Returns True when the optimizer step was applied (False off the boundary, or when an
        fp16 overflow skipped it — on every rank alike)."""
        if self.micro_steps % self.gas != 0 or self.micro_steps == 0:
            return False
        grads = self.grad_shards()  # fp32, this rank's part of every bucket
        inv_scale = 1.0 / self.loss_scale
        sq = torch.zeros(2, dtype=torch.float64, device=grads[0].device)  # [Σg², non-finite]
        for g in grads:
            if inv_scale != 1.0:
                g.mul_(inv_scale)
            sq[0] += torch.linalg.vector_norm(g).double() ** 2  # one pass, no copy; inf/nan propagate
        sq[1] = float(not math.isfinite(sq[0].item()))
        if self.grads_are_sharded():
            sq = sq.to(self.buckets[0].flat_param.device)  # (from the host, with offload)
            comm.all_reduce(sq, group=self.group)  # global norm and overflow, the same on all ranks
        overflow = bool(sq[1] > 0) or not math.isfinite(sq[0].item())
        if self.loss_scaler is not None:
            self.loss_scaler.update_scale(overflow)
        if overflow:
            self.skipped_steps += 1
            self.last_grad_norm = float("inf")
            self.clear_grads()
            return False
        norm = math.sqrt(sq[0].item())
        self.last_grad_norm = norm
        if self.clip > 0:  # torch.nn.utils.clip_grad_norm_'s rule
            coef = min(self.clip / (norm + 1e-6), 1.0)
            for g in grads:
                g.mul_(coef)
        self.adam_steps += 1
        if self.offload is not None:  # on the host; writes the updated shards back (zero_ref.offload)
            try:
                self.offload.step(self, grads)
            except BaseException:
                if self.offload.nvme:  # the store kept the previous version: drop the step, so training
                    self.adam_steps -= 1  # can go on from the previous state
                    self.clear_grads()
                raise
        elif self.client is not None:
            self.client.step(grads)
        else:
            for b, g in zip(self.buckets, grads):
                part = b.partition
                for start, end, cfg in self.adam_runs(b):
                    adam_update_(part.master[start:end], g[start:end], part.exp_avg[start:end],
                                 part.exp_avg_sq[start:end], self.adam_steps, cfg, self.adam_kernel)
        self.publish_params()
        self.clear_grads()
        return True

    def adam_runs(self, b) -> list[tuple[int, int, AdamConfig]]:
        """``(start, end, AdamConfig)`` over ``b``'s optimizer state: each param group's current values
        (a schedule may have changed its lr since the last step)."""
        return [(start, end, group_adam(self.param_groups[g], self.adam)) for start, end, g in b.adam_runs]

    def grads_are_sharded(self) -> bool:
        return True

    def grad_shards(self) -> list[torch.Tensor]:
        """fp32, this rank's part of every bucket's gradient, averaged over ranks (Adam reads these)."""
        raise NotImplementedError

    def averaged(self, grad_sum: torch.Tensor) -> torch.Tensor:
        """The mean over ranks of a summed gradient, in fp32. Ranks reduce with "sum" (gloo has no AVG) and
        divide once here. ``.float()`` is the tensor itself in fp32 and a copy otherwise: dividing it in place
        is safe, as gradients are cleared after the step."""
        return grad_sum.float().mul_(1.0 / self.world_size)

    def write_param_shard(self, b: Bucket, values: torch.Tensor) -> None:
        """Offload: updated values (on the host) into this rank's shard of ``b``'s device parameters."""
        self.offload.link.to_device(b.shard(b.flat_param), values)

    def publish_params(self) -> None:
        """Write each updated shard into the flat parameters and all-gather them (stages 1–2)."""
        for b in self.buckets:
            mine = b.shard(b.flat_param)
            if self.offload is None and b.partition.master.data_ptr() != mine.data_ptr():  # mixed precision
                mine.copy_(b.partition.master)  # cast down
            self._async(comm.all_gather(b.flat_param, mine, group=self.group, async_op=self.overlap_comm))
        self._wait_all()

    def clear_grads(self) -> None:
        """Zero the gradients kept between micro-steps (after a step, or a step skipped on overflow)."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        """Gradients are cleared after every step; this exists for drop-in loops."""

    def state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The tensors this rank holds for training, by category (what chapters measure)."""
        out = {"params": [], "grads": [], "optimizer": []}
        for b in self.buckets:
            out["params"].append(b.flat_param)
            # stage 2: the partition; stages 0-1: the full buffer (+ the host partition, with offload)
            out["grads"] += [g for g in (b.flat_grad, b.partition.grad) if g is not None]
            shared = b.flat_param.untyped_storage().data_ptr()  # fp32 training: the master is the parameters
            out["optimizer"] += [t for t in b.partition.optimizer_tensors()
                                 if t.untyped_storage().data_ptr() != shared]
        if self.client is not None:
            out["optimizer"] += self.client.state_tensors()
        return out
