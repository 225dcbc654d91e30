"""DeepSpeed's entry point and training loop, composed from zero_ref's stages.

    engine, optimizer, dataloader, lr_scheduler = zero_ref.ds.initialize(model=model, config="ds_config.json")
    for batch in batches:
        loss = engine(batch)          # the module's forward
        engine.backward(loss)         # loss / gradient_accumulation_steps (× the fp16 scale), reduce when due
        engine.step()                 # at the accumulation boundary: clip, Adam, schedule; else bookkeeping

``initialize`` joins torch.distributed if it is not joined yet, reads the config (``zero_ref.config``:
DeepSpeed's keys and defaults, one clear error per problem), and composes the stage of
``zero_optimization.stage`` (``zero_ref.stages``) with its knobs, precision and offload. The optimizer is
an ``"optimizer"`` section (Adam or AdamW) or a client ``torch.optim.Adam`` / ``AdamW`` whose
hyper-parameters and param groups the stage steps on its own partitions (``compat.client_adam``); any other
client optimizer runs its own step there (ZeRO 1-3: DeepSpeed's tested list, or any with
``zero_allow_untested_optimizer``).

At ZeRO stages 1-3 a script may also call ``loss.backward()`` on what ``engine(...)`` returned
(``torch_backward``). Several backwards before one ``step()`` train as one backward of their sum. A module
called directly, outside its engine (a GAN's discriminator under the generator's backward), accumulates into
``param.grad`` as a plain module does, and the engine's next backward reduces what is left there.
Checkpoints: ``save_checkpoint`` / ``load_checkpoint`` delegate to ``zero_ref.checkpoint``.
"""
from __future__ import annotations

import os
import time
import warnings
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn

from zero_ref import activation_checkpointing, checkpoint, comm
from zero_ref.config import Config, load, parse
from zero_ref.ds.basic_optimizer import BasicOptimizer
from zero_ref.ds.comm import init_distributed
from zero_ref.ds.compat import (Accessors, adopt_deepspeed_zero_init, client_adam, config_source,
                                refuse_expert_parallel)
from zero_ref.ds.runtime import lr_schedules
from zero_ref.ds.stage0_state import Stage0Optimizer
from zero_ref.ds.torch_backward import TorchBackward
from zero_ref.measure import unique_storage_bytes
from zero_ref.optim import AdamConfig
from zero_ref.precision import FP16_DEFAULTS, loss_scaler_from_config
from zero_ref.stages import STAGES
from zero_ref.stages.zero3 import unit_of
from zero_ref.stages.zero3.zeropp import ZeroPP

__all__ = ["initialize", "Engine", "ENGINES"]

#: The stage class of each ``zero_optimization.stage``; stage 0 with DeepSpeed's stage-0 optimizer state dict.
ENGINE_STAGES = {**STAGES, 0: Stage0Optimizer}

#: ``initialize``'s engine for a model of a given type (else ``Engine``): ``zero_ref.ds.pipe`` registers
#: ``PipelineModule -> PipelineEngine`` here, so this module never imports the pipeline.
ENGINES: dict[type, type] = {}


def initialize(args=None, model: nn.Module | None = None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port: int = 29500, mpu=None, dist_init_required: bool | None = None,
               collate_fn=None, config=None, mesh_param=None, config_params=None):
    """``(engine, optimizer, training_dataloader, lr_scheduler)``, as ``deepspeed.initialize`` returns them.

    ``config`` is a dict, a JSON path or base64 JSON (or ``args.deepspeed_config``; ``config_params`` is
    DeepSpeed's older name). The dataloader and scheduler are None unless ``training_data`` / a
    scheduler is given. ``mpu`` and ``mesh_param`` (model parallelism) are not supported."""
    if model is None:
        raise ValueError("initialize: model is required (the torch.nn.Module to train)")
    for name, value in (("mpu", mpu), ("mesh_param", mesh_param)):
        if value is not None:
            raise ValueError(f"initialize: {name}= (model parallelism) is not supported by zero_ref's engine")
    # a missing file or bad JSON fails here, before any process group exists
    raw = load(config_source(args, config, config_params))
    init_distributed(distributed_port=distributed_port, dist_init_required=dist_init_required)
    kind = next((engine for module, engine in ENGINES.items() if isinstance(model, module)), Engine)
    engine = kind(model, raw, optimizer=optimizer, model_parameters=model_parameters, training_data=training_data,
                  lr_scheduler=lr_scheduler, collate_fn=collate_fn)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


class Engine(TorchBackward, Accessors, nn.Module):
    """The model, its ZeRO stage (``.optimizer``), the schedule and the step counters."""

    def __init__(self, model: nn.Module, config, *, optimizer=None, model_parameters=None, training_data=None,
                 lr_scheduler=None, collate_fn=None, dp_group=None):
        super().__init__()
        self.dp_group = dist.group.WORLD if dp_group is None else dp_group  # (a pipeline's: one stage's replicas)
        self.dp_rank, self.dp_world_size = dist.get_rank(self.dp_group), dist.get_world_size(self.dp_group)
        self.global_rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.config: Config = config if isinstance(config, Config) and config.batch else parse(config, dp=self.dp_world_size)
        cfg = self.config
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.device = torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        self.module = model.to(self.device)
        refuse_expert_parallel(model)
        self.global_steps = self.global_samples = self.micro_steps = self.skipped_steps = 0
        self._no_sync = False
        self._step_applied = False
        self._boundary: bool | None = None  # set_gradient_accumulation_boundary's, if the caller sets it
        self._counted = False  # a backward off the boundary counted its micro-step (the caller skips step())
        # backward bookkeeping (``backward``, and ``loss.backward()`` through torch_backward's hooks)
        self._in_engine_backward = False  # engine.backward is running: it scales the loss itself
        self._torch_backward: int | None = None  # autograd graph task of an open loss.backward(), if any
        self._forwards = 0  # forwards with gradients since the last backward began
        self._scaled = False  # engine.scale(loss) was called for the next loss.backward() (fp16)
        self._backward_start = 0.0
        self._times = {"forward": 0.0, "backward": 0.0, "step": 0.0}
        adopt_deepspeed_zero_init(self.module)
        self._broadcast_model()
        adam, groups, self.client_optimizer = client_adam(self.module, cfg, optimizer, model_parameters,
                                                          verbose=self.dp_rank == 0)
        # The stage's param_groups are torch's (one per group, each with its own lr, betas, eps and weight
        # decay, as DeepSpeed's optimizer takes them); schedules write the rate there and the step reads it.
        stage = ENGINE_STAGES[cfg.zero_optimization.stage]
        stepped = {} if adam is not None else {"optimizer": self.client_optimizer}  # its own step, on the partitions
        self.optimizer = stage(model, param_groups=groups, **stepped, **self.stage_kwargs(adam))
        self._hook_parameters()
        self._lr_source = self.optimizer
        self.lr_scheduler = self._scheduler(lr_scheduler)
        self._sync_lr()
        self.training_dataloader = self._dataloader(training_data, collate_fn)
        # An activation_checkpointing section configures that module (DeepSpeed's engine leaves this to the
        # script's deepspeed.checkpointing.configure call); its notes say what was not applied.
        ac_notes = activation_checkpointing.configure_from_config(cfg)
        if self.dp_rank == 0:
            for note in (*cfg.notes, *ac_notes):
                print(f"[zero_ref] note: {note}")

    # ------------------------------------------------------------ set-up
    def _broadcast_model(self) -> None:
        """Every rank starts from rank 0's parameters, so a script that seeds per rank (or not at all) still
        trains one model. Parameters that zero.Init has partitioned came from rank 0 already; buffers are
        not sent (nor in DeepSpeed)."""
        if self.dp_world_size == 1:
            return
        src = dist.get_global_rank(self.dp_group, 0)
        with torch.no_grad():
            for p in self.module.parameters():
                if unit_of(p) is None:
                    comm.broadcast(p.data, src=src, group=self.dp_group)

    def stage_kwargs(self, adam: AdamConfig) -> dict:
        """The stage's keyword arguments, read from the config."""
        cfg, z = self.config, self.config.zero_optimization
        scaler = None
        if cfg.precision == "fp16":
            scaler = loss_scaler_from_config({k: getattr(cfg.fp16, k) for k in FP16_DEFAULTS})
        kw = dict(adam=adam, precision=cfg.precision, group=self.dp_group, reduce_bucket_size=z.reduce_bucket_size,
                  overlap_comm=z.overlap_comm, gradient_accumulation_steps=cfg.batch.gradient_accumulation_steps,
                  gradient_clipping=cfg.gradient_clipping, loss_scaler=scaler, offload_optimizer=z.offload_optimizer,
                  offload_param=z.offload_param, aio=cfg.aio, sub_group_size=z.sub_group_size)
        if z.stage == 3:
            kw.update(prefetch_bucket_size=z.stage3_prefetch_bucket_size,
                      param_persistence_threshold=z.stage3_param_persistence_threshold,
                      max_live_parameters=z.stage3_max_live_parameters,
                      max_reuse_distance=z.stage3_max_reuse_distance,
                      zeropp=ZeroPP(z.zero_quantized_weights, z.zero_hpz_partition_size, z.zero_quantized_gradients,
                                    z.zero_quantized_nontrainable_weights))
        return kw

    def _scheduler(self, client):
        """The client's scheduler (or callable), else the config's; None if neither."""
        if client is not None:
            if callable(client) and not hasattr(client, "step"):  # DeepSpeed's scheduler callable
                if self.client_optimizer is None:
                    return client(BasicOptimizer(self.optimizer))
                self._lr_source = self.client_optimizer
                return client(self.client_optimizer)
            if self.client_optimizer is not None and getattr(client, "optimizer", None) is self.client_optimizer:
                self._lr_source = self.client_optimizer  # a torch scheduler drives the client optimizer's lr
            return client
        sch = self.config.scheduler
        if sch is None:
            return None
        params = {f: getattr(sch.params, f) for f in sch.params.__dataclass_fields__}
        return lr_schedules.build(sch.type, self.optimizer, params)

    def _dataloader(self, data, collate_fn):
        if data is None:
            return None
        from torch.utils.data import DataLoader, DistributedSampler
        sampler = DistributedSampler(data, num_replicas=self.dp_world_size, rank=self.dp_rank)
        return DataLoader(data, batch_size=self.train_micro_batch_size_per_gpu(), sampler=sampler,
                          collate_fn=collate_fn, drop_last=self.config.dataloader_drop_last)

    def _sync_lr(self) -> None:
        """A torch scheduler on the client optimizer writes its param_groups: the stage steps with those rates."""
        if self._lr_source is not self.optimizer:
            for mine, theirs in zip(self.optimizer.param_groups, self._lr_source.param_groups):
                mine["lr"] = float(theirs["lr"])

    # ------------------------------------------------------------ the training loop
    def forward(self, *args, **kwargs):
        """The module's forward. Its outputs that need gradients get a hook: a ``loss.backward()`` through
        them runs as ``engine.backward(loss)`` does (see torch_backward)."""
        start = time.perf_counter()
        out = self.module(*args, **kwargs)
        if self._hook_outputs(out):
            self._forwards += 1
        self._times["forward"] += time.perf_counter() - start
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backward of loss / gradient_accumulation_steps (× the fp16 loss scale); gradients are
        reduced (stage 0/1: at the boundary; stage 2/3: every micro-step) by the stage. Returns the loss
        divided by gradient_accumulation_steps, as DeepSpeed's does. ``retain_graph`` is handed to autograd;
        ``scale_wrt_gas=False`` leaves the loss undivided (the script has divided it)."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError("backward: loss must be a scalar tensor with a grad_fn (the output of a forward with "
                             "gradients enabled)")
        self._drop_failed_backward()
        again = self._again()
        start = time.perf_counter()
        self._in_engine_backward = True
        try:
            if self._no_sync:
                self.optimizer.accumulate(loss)  # no reduction, no micro-step: the next backward outside reduces it
            else:
                self.optimizer.backward(loss, retain_graph=retain_graph, scale_wrt_gas=scale_wrt_gas, again=again)
        finally:
            self._in_engine_backward = False
        self._times["backward"] += time.perf_counter() - start
        self._count_off_boundary()
        return loss / self.gradient_accumulation_steps() if scale_wrt_gas else loss

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times the fp16 loss scale, for a script that calls ``engine.scale(loss).backward()``; the
        loss itself in fp32 and bf16 (no loss scale). With fp16 a plain ``loss.backward()`` is refused."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError("scale: loss must be a scalar tensor with a grad_fn; for a non-scalar tensor call "
                             "tensor.backward(grad) on the output of engine(...)")
        self._scaled = True
        return loss * self.optimizer.loss_scale if self.config.precision == "fp16" else loss

    def _again(self) -> bool:
        """True if the backward about to run belongs to a micro-batch that has had its backward already.

        Several backwards before one ``engine.step()`` (a GAN's ``engine.backward(loss_real)``,
        ``engine.backward(loss_fake)``) train as one backward of their sum: the stage keeps the micro-step's
        boundary and reopens gradients it has reduced already (``begin_backward(again=True)``). Inside
        ``no_sync()`` nothing is counted."""
        self._forwards = 0
        return not self._no_sync and self.optimizer.micro_steps == self.micro_steps + 1

    @contextmanager
    def no_sync(self):
        """Backwards inside only accumulate this rank's gradients (no reduction, no micro-step counted); the
        next backward outside reduces them with its own. Stages 0–1 only (ZeRO-2/3 partition gradients by
        reducing them), not re-entrant, and ``step()`` inside is an error, as in DeepSpeed."""
        if self.zero_optimization_stage() >= 2:
            raise RuntimeError(f"no_sync is incompatible with the gradient partitioning of ZeRO stage "
                               f"{self.zero_optimization_stage()} (DeepSpeed refuses it too): use stage 0 or 1, or "
                               "let gradient_accumulation_steps accumulate")
        if self._no_sync:
            raise RuntimeError("no_sync context manager reentry is unsupported (as in DeepSpeed)")
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = False

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Say whether the next backward ends the accumulation (accelerate says it before each backward, and
        calls ``step()`` only on the boundary, as DeepSpeed's engine allows). zero_ref's stages count
        micro-batches, so a boundary must fall where ``gradient_accumulation_steps`` puts it."""
        self._boundary = bool(is_boundary)

    def _count_off_boundary(self) -> None:
        """After a backward under ``set_gradient_accumulation_boundary``: check that the boundary is where the
        stage counts it, and off the boundary count the micro-step that no ``step()`` will."""
        self._counted = False
        if self._boundary is None or self._no_sync:
            return
        if self._boundary != self.is_gradient_accumulation_boundary():
            raise RuntimeError(
                f"set_gradient_accumulation_boundary({self._boundary}) at micro-batch {self.micro_steps + 1}, but "
                f"gradient_accumulation_steps is {self.gradient_accumulation_steps()}: zero_ref steps after every "
                f"{self.gradient_accumulation_steps()} micro-batches (DeepSpeed steps where it is told); make the "
                "number of micro-batches per epoch a multiple of gradient_accumulation_steps")
        if not self._boundary:
            self.micro_steps += 1
            self._counted = True

    def is_gradient_accumulation_boundary(self) -> bool:
        """True during the last micro-batch of an optimizer step (its backward and its step())."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def step(self, lr_kwargs: dict | None = None) -> None:
        """At the accumulation boundary: the stage's step (unscale, overflow check, clip, Adam), then
        the schedule (if the step was applied: an fp16 overflow skips both); always count the micro-step."""
        if self._no_sync:
            raise RuntimeError("engine.step() inside no_sync(): step after the context, once a backward outside it "
                               "has reduced the gradients (DeepSpeed refuses it too)")
        if self._counted:  # off the boundary, the backward counted this micro-step already
            self._counted = False
            return
        if self.optimizer.micro_steps != self.micro_steps + 1:
            raise RuntimeError("engine.step() must follow exactly one backward per micro-batch: engine.backward(loss), "
                               "or loss.backward() on what engine(...) returned (a backward that reached none of the "
                               "model's trainable parameters does not count, nor does loss.backward() on the module "
                               "called directly: that only accumulates into param.grad; backwards so far: "
                               f"{self.optimizer.micro_steps}, step calls: {self.micro_steps})")
        start = time.perf_counter()
        if self.is_gradient_accumulation_boundary():
            self._sync_lr()
            self._step_applied = self.optimizer.step()
            if self._step_applied and self.lr_scheduler is not None:
                with warnings.catch_warnings():  # a torch scheduler on the client optimizer, which the stage
                    warnings.filterwarnings("ignore", "Detected call of `lr_scheduler")  # steps for it
                    self.lr_scheduler.step(**(lr_kwargs or {}))
            elif not self._step_applied:
                self.skipped_steps += 1
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self._times["step"] += time.perf_counter() - start
            if self.config.steps_per_print and self.global_steps % self.config.steps_per_print == 0:
                self._report()
        self.micro_steps += 1

    def _report(self) -> None:
        if self.dp_rank != 0:
            return
        print(f"[zero_ref] step={self.global_steps}, skipped={self.skipped_steps}, lr={self.get_lr()}, "
              f"mom={self.get_mom()}")
        if self.config.wall_clock_breakdown:
            n = self.config.steps_per_print
            print("[zero_ref] time (ms) | " + " | ".join(f"{k}: {1e3 * v / n:.2f}" for k, v in self._times.items()))
            self._times = dict.fromkeys(self._times, 0.0)
        if self.config.memory_breakdown:
            held = {k: unique_storage_bytes(v) for k, v in self.optimizer.state_tensors().items()}
            print("[zero_ref] bytes held (rank 0) | " + " | ".join(f"{k}: {v}" for k, v in held.items()))

    def zero_grad(self) -> None:
        """Every ``param.grad`` of the module to None, as DeepSpeed's does: what a backward outside the engine
        left there is dropped (at stages 0-1 also what this step's backwards accumulated so far; at stages 2-3
        those are in the stage's gradient partition, which the stage clears after each step)."""
        for p in self.module.parameters():
            p.grad = None

    # ------------------------------------------------------------ checkpoints (zero_ref.checkpoint)
    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return self.config.zero_optimization.stage3_gather_16bit_weights_on_model_save

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False):
        """ZeRO-3's weights gathered (a collective: every rank calls it), on rank 0; None on the others, as
        DeepSpeed's (accelerate's ``get_state_dict`` calls it when saving a ZeRO-3 model)."""
        if self.zero_optimization_stage() != 3:
            raise ValueError("_zero3_consolidated_16bit_state_dict requires ZeRO-3 mode (as in DeepSpeed): at stages "
                             "0-2 engine.module.state_dict() holds the whole model")
        state = self.optimizer.state_dict()
        first: dict[int, str] = {}  # a parameter held by two modules (tied weights) is one tensor, as in DeepSpeed's
        for name, p in self.module.named_parameters(remove_duplicate=False):
            if name in state:
                state[name] = state[first.setdefault(id(p), name)]
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        return state if self.global_rank == 0 else None

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """The module's weights in their training dtype, written by rank 0 (every rank must call it, as in
        DeepSpeed). At ZeRO-3 only with ``stage3_gather_16bit_weights_on_model_save``: the parameters are
        gathered first; without it nothing is written and the answer is False (DeepSpeed's behaviour)."""
        if self.zero_optimization_stage() == 3:
            if not self.config.zero_optimization.stage3_gather_16bit_weights_on_model_save:
                if self.global_rank == 0:
                    print(f"[zero_ref] note: did not save {os.path.join(save_dir, save_filename)}: "
                          "stage3_gather_16bit_weights_on_model_save is false")
                return False
            state = self.optimizer.state_dict()
        else:
            state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        if self.global_rank == 0:
            os.makedirs(save_dir, exist_ok=True)
            path = os.path.join(save_dir, save_filename)
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)  # no half-written file under the final name
        comm.barrier(group=self.dp_group)
        return True

    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest: bool = True,  # noqa: B006 (DeepSpeed's)
                        exclude_frozen_parameters: bool = False):
        """Every rank must call it (it has collectives). Delegates to ``zero_ref.checkpoint.save``."""
        if exclude_frozen_parameters:
            raise ValueError("save_checkpoint: exclude_frozen_parameters=True is not supported by zero_ref")
        return checkpoint.save(self, save_dir, tag, client_state, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False, custom_load_fn=None,
                        load_rng_state: bool = False):
        """``(load_path, client_state)``. Delegates to ``zero_ref.checkpoint.load``; DeepSpeed's argument order.
        The torch RNG is left untouched, as by DeepSpeed; ``load_rng_state=True`` (zero_ref's own keyword)
        restores each rank's saved RNG state, so dropout continues the saved stream."""
        if not load_module_strict or custom_load_fn is not None:
            raise ValueError("load_checkpoint: load_module_strict=False and custom_load_fn are not supported by zero_ref")
        if load_module_only:
            load_optimizer_states = load_lr_scheduler_states = False
        return checkpoint.load(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states, load_rng_state)
