"""DeepSpeed's ``PipelineEngine``: ``train_batch(data_iter)`` and ``eval_batch(data_iter)`` on a ``PipelineModule``.

    engine, *_ = zero_ref.initialize(model=PipelineModule(layers, num_stages=2, loss_fn=F.mse_loss), config=cfg)
    for step in range(steps):
        loss = engine.train_batch(data_iter)   # m = gradient_accumulation_steps micro-batches, one optimizer step

One ``train_batch`` is one optimizer step over m micro-batches, run in DeepSpeed's 1F1B order
(``zero_ref.parallel.schedules.stage_order``: warm-up forwards, one-forward-one-backward, cool-down).
The first stage reads the inputs (``batch[0]``) and the last stage the labels (``batch[1]``) from their
own ``data_iter``, one batch per micro-batch, as DeepSpeed's ``_exec_load_micro_batch`` does. Activations
go forward and their gradients back with point-to-point sends, each preceded by a small header (dtype,
shape), so the layers may change the shape between stages. After the schedule: the tied weights'
gradients are summed over the stages that share them, then the data-parallel gradient reduction and
the step of the ZeRO stage (0 or 1) over this stage's data-parallel group. The returned loss is the
mean over micro-batches, averaged over data-parallel ranks and sent to every stage.

As in DeepSpeed: ZeRO-2/3 are refused (``PipelineEngine.__init__`` asserts "ZeRO-2 and ZeRO-3 are
incompatible with pipeline parallelism"), and ``engine(x)`` / ``backward`` / ``step`` are not used.
Simplified vs DeepSpeed: no fp16 (bf16 and fp32 are), and no gradient clipping — DeepSpeed clips by the
norm over every stage, while a zero_ref stage measures the norm of its own partition only, so the
engine refuses ``gradient_clipping`` > 0 instead of clipping by a different norm.
"""
from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, DistributedSampler

from zero_ref import comm
from zero_ref.config import ConfigError
from zero_ref.ds.engine import ENGINES, Engine
from zero_ref.ds.pipe.module import PipelineModule
from zero_ref.ds.runtime.dataloader import RepeatingLoader
from zero_ref.parallel.pipeline import ZERO_WITH_PP
from zero_ref.parallel.schedules import stage_order

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.bool)
_HEADER = 10  # dtype, ndim, up to 8 dimensions


class PipelineEngine(Engine):
    """The engine of a ``zero_ref.ds.pipe.PipelineModule`` (see the module docstring)."""

    def __init__(self, model, config, **kwargs):
        super().__init__(model, config, dp_group=model.dp_group, **kwargs)
        cfg = self.config
        if cfg.zero_optimization.stage >= 2:
            raise ConfigError("zero_optimization.stage", ZERO_WITH_PP.format(stage=cfg.zero_optimization.stage))
        if cfg.precision == "fp16":
            raise ConfigError("fp16.enabled", "fp16 with zero_ref's PipelineEngine is not supported: use bf16 (no loss "
                                              "scale to agree on between stages) or fp32")
        if cfg.gradient_clipping > 0:
            raise ConfigError("gradient_clipping", f"gradient_clipping={cfg.gradient_clipping:g} with a pipeline: "
                              "DeepSpeed clips by the gradient norm over all stages, and a zero_ref stage measures only "
                              "its own; set \"gradient_clipping\": 0 (DeepSpeed's default is 1.0, so say it explicitly)")
        self.num_stages, self.stage_id = model.num_stages, model.stage_id
        self.micro_batches = self.gradient_accumulation_steps()
        self.data_iterator = None
        if kwargs.get("training_data") is not None:
            self._build_data_iter(kwargs["training_data"], kwargs.get("collate_fn"))

    def _build_data_iter(self, dataset, collate_fn=None) -> None:
        """What ``train_batch()`` reads without a ``data_iter``: ``training_data`` in order over this stage's
        data-parallel group, round and round, on the first and last stages (DeepSpeed's ``_build_data_iter``)."""
        sampler = DistributedSampler(dataset, num_replicas=self.dp_world_size, rank=self.dp_rank, shuffle=False)
        batch = self.train_micro_batch_size_per_gpu()
        loader = RepeatingLoader(DataLoader(dataset, batch_size=batch, sampler=sampler, collate_fn=collate_fn,
                                            drop_last=self.config.dataloader_drop_last))
        if self.is_first_stage() or self.is_last_stage():
            self.training_dataloader, self.data_iterator = loader, iter(loader)

    def stage_kwargs(self, adam):
        kw = super().stage_kwargs(adam)
        kw["gradient_accumulation_steps"] = 1  # the pipeline accumulates its m micro-batches itself
        return kw

    # ------------------------------------------------------------ DeepSpeed's pipeline API
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def set_dataiterator(self, iterator) -> None:
        self.data_iterator = iterator

    def train_batch(self, data_iter=None) -> torch.Tensor:
        """Forward and backward of m micro-batches (1F1B), then one optimizer step; the mean loss."""
        if not torch.is_grad_enabled():
            raise RuntimeError("train_batch() requires gradients enabled; use eval_batch() instead (as in DeepSpeed)")
        if data_iter is not None:
            self.data_iterator = data_iter
        self._need_data()
        self.module.train()
        start = time.perf_counter()
        losses = self._run(stage_order("1f1b", self.num_stages, self.micro_batches, self.stage_id), train=True)
        self.module.allreduce_tied_weight_gradients()
        # the data-parallel reduction of what the m backwards accumulated (a backward through nothing)
        self.optimizer.backward(torch.zeros((), requires_grad=True))
        self._sync_lr()
        self._step_applied = self.optimizer.step()
        if self._step_applied and self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.global_steps += 1
        self.global_samples += self.train_batch_size()
        self.micro_steps += self.micro_batches
        self._times["step"] += time.perf_counter() - start
        return self._mean_loss(losses, self.micro_batches)

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output="avg", bcast_loss=True,
                   num_micro_batches=None):
        """Forwards of m micro-batches without gradients; the mean loss (DeepSpeed's signature)."""
        if return_logits or not compute_loss or reduce_output != "avg" or not bcast_loss:
            raise ValueError("eval_batch: zero_ref supports the defaults only (return_logits=False, compute_loss=True, "
                             "reduce_output='avg', bcast_loss=True)")
        m = num_micro_batches or self.micro_batches
        train_iterator, self.data_iterator = self.data_iterator, data_iter
        self.module.eval()
        try:
            with torch.no_grad():
                losses = self._run([("F", i, 0) for i in range(m)], train=False)
        finally:
            self.data_iterator = train_iterator
        return self._mean_loss(losses, m)

    def _hook_parameters(self) -> None:
        """None of the Engine's backward hooks: train_batch runs every backward itself."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("Only train_batch() is accessible in pipeline mode (DeepSpeed's PipelineEngine says so too)")

    def backward(self, *args, **kwargs):
        raise RuntimeError("Only train_batch() is accessible in pipeline mode (DeepSpeed's PipelineEngine says so too)")

    def step(self, *args, **kwargs):
        raise RuntimeError("Only train_batch() is accessible in pipeline mode (DeepSpeed's PipelineEngine says so too)")

    # ------------------------------------------------------------ one schedule
    def _need_data(self) -> None:
        if self.data_iterator is None and (self.is_first_stage() or self.is_last_stage()):
            raise ValueError("train_batch: no data; pass data_iter= (an iterator of (inputs, labels) batches) "
                             "or training_data= to initialize")

    def _run(self, order, train: bool) -> list[torch.Tensor]:
        m = self.module
        prev = m.pp_ranks[self.stage_id - 1] if not self.is_first_stage() else None
        nxt = m.pp_ranks[self.stage_id + 1] if not self.is_last_stage() else None
        stash, losses, pending = {}, [], []
        for kind, i, _ in order:
            if kind == "F":
                labels = None
                if self.is_first_stage() or self.is_last_stage():
                    batch = next(self.data_iterator)
                    labels = batch[1] if self.is_last_stage() else None
                x = batch[0] if self.is_first_stage() else self._recv(prev)
                if train and not self.is_first_stage():
                    x.requires_grad_()
                t0 = time.perf_counter()
                out = m(x)
                if self.is_last_stage():
                    out = m.loss_fn(out, labels)
                    losses.append(out.detach())
                else:
                    pending += self._send(out, nxt)
                self._times["forward"] += time.perf_counter() - t0
                stash[i] = (x, out)
            else:
                x, out = stash.pop(i)
                t0 = time.perf_counter()
                if self.is_last_stage():
                    (out / self.micro_batches).backward()  # DeepSpeed's backward: loss / gradient_accumulation_steps
                else:
                    torch.autograd.backward(out, self._recv(nxt))
                self._times["backward"] += time.perf_counter() - t0
                if not self.is_first_stage():
                    pending += self._send(x.grad, prev)
        for work in pending:
            work.wait()
        return losses

    def _send(self, t: torch.Tensor, dst: int) -> list:
        if not torch.is_tensor(t) or t.dim() > _HEADER - 2:
            raise ValueError(f"pipeline: a stage must pass one tensor of at most {_HEADER - 2} dimensions to the next, "
                             f"got {type(t).__name__}")
        t = t.detach().contiguous()
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0], header[1] = _DTYPES.index(t.dtype), t.dim()
        header[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        # the buffers must live until the sends complete: the work handles keep them
        return [comm.isend(header, dst), comm.isend(t, dst), _Keep(header, t)]

    def _recv(self, src: int) -> torch.Tensor:
        header = torch.empty(_HEADER, dtype=torch.int64)
        comm.recv(header, src)
        shape = header[2:2 + int(header[1])].tolist()
        buf = torch.empty(shape, dtype=_DTYPES[int(header[0])])
        comm.recv(buf, src)
        return buf

    def _mean_loss(self, losses: list[torch.Tensor], m: int) -> torch.Tensor:
        """Mean over micro-batches on the last stage, averaged over its data-parallel group, sent to every stage."""
        mod = self.module
        if self.is_last_stage():
            loss = (sum(losses) / m).detach().float().reshape(1)
            if self.dp_world_size > 1:
                comm.all_reduce(loss, group=self.dp_group)
                loss /= self.dp_world_size
        else:
            loss = torch.zeros(1)
        if self.num_stages > 1:
            comm.broadcast(loss, src=mod.pp_ranks[-1], group=mod.pp_group)
        return loss.reshape(())


class _Keep:
    """Holds a send's buffers until the schedule's end (``wait`` does nothing)."""

    def __init__(self, *tensors):
        self.tensors = tensors

    def wait(self) -> None:
        pass


ENGINES[PipelineModule] = PipelineEngine  # initialize(model=PipelineModule(...)) builds this engine
