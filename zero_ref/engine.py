"""DeepSpeed's entry point and training-loop API, over zero_ref's stages.

    engine, optimizer, dataloader, lr_scheduler = zero_ref.initialize(model=model, config="ds_config.json")
    for batch in batches:
        loss = engine(batch)          # the module's forward
        engine.backward(loss)         # loss / gradient_accumulation_steps (× the fp16 scale), reduce when due
        engine.step()                 # at the accumulation boundary: clip, Adam, schedule; else bookkeeping

As in DeepSpeed 0.19.8, at ZeRO stages 1-3 the script may call ``loss.backward()`` on what ``engine(...)``
returned instead of ``engine.backward(loss)`` (``engine.scale(loss).backward()`` with fp16): hooks on the
outputs and the parameters run it as ``engine.backward`` (see ``Engine._hook_outputs``). Several backwards
before one ``step()``, of either kind, train as one backward of their sum.

``initialize`` has DeepSpeed's signature and return tuple. It joins torch.distributed if it is not
joined yet (from torchrun's environment, or as a single rank when there is none), reads the config
(``zero_ref.config``: DeepSpeed's keys and defaults, one clear error per problem), and composes the
stage of ``zero_optimization.stage`` (``zero_ref.stages``) with its knobs, precision and offload.

The optimizer: an ``"optimizer"`` section with type Adam or AdamW (DeepSpeed's Adam is AdamW unless
``adam_w_mode`` is false), or ``optimizer=`` a ``torch.optim.Adam`` / ``AdamW`` (or a callable making
one) whose hyper-parameters are read — the stage then steps Adam on its own partitions, as DeepSpeed
wraps a client optimizer in its ZeRO optimizer. Any other optimizer is an error: the stages implement
Adam(W) only (``zero_allow_untested_optimizer`` cannot change that). As in DeepSpeed, ``optimizer=``
wins over the config section, and with ZeRO-Offload a client optimizer needs
``"zero_force_ds_cpu_optimizer": false``. Param groups (``model_parameters`` as dicts, or the client
optimizer's groups) keep their own lr, betas, eps and weight decay, as in DeepSpeed.

fp16 on CPU is trained (chapter 12 shows loss scaling at work on CPU ranks); DeepSpeed 0.19.8 refuses it on
CPUs whose oneDNN has no fp16 ("Type fp16 is not supported on your device.", deepspeed/runtime/engine.py,
``_do_sanity_check``): a script that must also run under DeepSpeed on CPU takes bf16 or fp32.

Checkpoints: ``save_checkpoint`` / ``load_checkpoint`` delegate to zero_ref.checkpoint.
"""
from __future__ import annotations

import os
import time
import warnings
from contextlib import contextmanager
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn

from zero_ref import activation_checkpointing, comm, lr_schedules
from zero_ref.config import Config, ConfigError, load, parse
from zero_ref.measure import unique_storage_bytes
from zero_ref.optim import AdamConfig
from zero_ref.precision import FP16_DEFAULTS, loss_scaler_from_config
from zero_ref.stages import STAGES
from zero_ref.stages.param_groups import HYPERPARAMETERS

__all__ = ["initialize", "init_distributed", "add_config_arguments", "tp_model_init", "init_inference", "Engine"]

AUTOTP = ("DeepSpeed's AutoTP (tp_model_init, tensor_parallel.autotp_size) shards a HuggingFace model's linear "
          "layers over tensor-parallel ranks; zero_ref has no AutoTP. Its tensor parallelism is Megatron-style "
          "modules for its own GPT (zero_ref.parallel.tensor.TensorParallelGPT, chapter 19), composed with pipeline "
          "and data parallelism by hand (zero_ref.parallel.three_d); the engine runs data parallelism with ZeRO "
          "0-3 and, for a zero_ref.pipe.PipelineModule, pipeline parallelism")


def tp_model_init(model, tp_size, dtype, config=None, **kwargs):
    """DeepSpeed's AutoTP entry point: refused, with what zero_ref supports instead."""
    raise NotImplementedError(f"tp_model_init: {AUTOTP}")


def init_inference(model, config=None, **kwargs):
    """DeepSpeed's inference engine (kernel injection, AutoTP): refused; zero_ref trains only."""
    raise NotImplementedError("init_inference: zero_ref has no inference engine (DeepSpeed's injects inference "
                              "kernels and AutoTP); run the module itself under torch.no_grad(), or "
                              "PipelineEngine.eval_batch for a PipelineModule")


def add_config_arguments(parser):
    """DeepSpeed's ``--deepspeed`` / ``--deepspeed_config`` (and the deprecated ``--deepscale*``) arguments,
    as ``deepspeed.add_config_arguments`` adds them; ``initialize(args=...)`` reads the config path."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on the engine)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true", help="Deprecated: --deepspeed")
    group.add_argument("--deepscale_config", default=None, type=str, help="Deprecated: --deepspeed_config")
    return parser


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
    if config is not None and config_params is not None:
        raise ValueError("initialize: give config= or its older name config_params=, not both")
    config = config if config is not None else config_params
    from_args = getattr(args, "deepspeed_config", None)
    if from_args is None and getattr(args, "deepscale_config", None) is not None:  # DeepSpeed still reads it
        warnings.warn("args.deepscale_config is deprecated: use --deepspeed_config", DeprecationWarning)
        from_args = args.deepscale_config
    if config is not None and from_args is not None:
        raise ValueError("initialize: the config is given twice (config= and args.deepspeed_config); give one")
    config = config if config is not None else from_args
    if config is None:
        raise ValueError("initialize: no config; pass config= (a dict or a JSON path) or args.deepspeed_config")
    raw = load(config)  # a missing file or bad JSON fails here, before any process group exists
    init_distributed(distributed_port=distributed_port, dist_init_required=dist_init_required)
    from zero_ref.pipe import PipelineModule  # a PipelineModule gets DeepSpeed's PipelineEngine
    kind = Engine
    if isinstance(model, PipelineModule):
        from zero_ref.pipe.engine import PipelineEngine as kind
    engine = kind(model, raw, optimizer=optimizer, model_parameters=model_parameters, training_data=training_data,
                  lr_scheduler=lr_scheduler, collate_fn=collate_fn)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True, distributed_port: int = 29500,
                     verbose: bool = True, timeout=None, init_method: str | None = None,
                     dist_init_required: bool | None = None, config=None, rank: int = -1, world_size: int = -1) -> None:
    """Join torch.distributed unless joined (DeepSpeed's signature): from the launcher's environment
    (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or ``init_method`` with ``rank`` and
    ``world_size``, else as the only rank of a one-process group (no MPI discovery, no comm config)."""
    if dist.is_initialized():
        return
    if dist_init_required is False:
        raise RuntimeError("torch.distributed is not initialized and dist_init_required=False: call "
                           "torch.distributed.init_process_group first (or leave dist_init_required unset)")
    cuda = torch.cuda.is_available()
    backend = dist_backend or ("nccl" if cuda else "gloo")
    extra = {} if timeout is None else {"timeout": timeout}
    if init_method is not None and rank >= 0 and world_size > 0:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, **extra)
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, init_method=init_method, **extra)
    else:  # `python train.py` without a launcher: one rank, no network
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **extra)


class Engine(nn.Module):
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
        self._refuse_expert_parallel(model)
        self.global_steps = self.global_samples = self.micro_steps = self.skipped_steps = 0
        self._no_sync = False
        self._step_applied = False
        # backward bookkeeping (``backward``, and ``loss.backward()`` through the hooks below)
        self._in_engine_backward = False  # engine.backward is running: it scales the loss itself
        self._torch_backward: int | None = None  # autograd graph task of an open loss.backward(), if any
        self._forwards = 0  # forwards with gradients since the last backward began
        self._scaled = False  # engine.scale(loss) was called for the next loss.backward() (fp16)
        self._backward_start = 0.0
        self._times = {"forward": 0.0, "backward": 0.0, "step": 0.0}
        self._take_from_deepspeeds_zero_init()
        self._broadcast_model()
        adam, groups, self.client_optimizer = self._adam(optimizer, model_parameters)
        # The stage's param_groups are torch's (one per group, each with its own lr, betas, eps and weight
        # decay, as DeepSpeed's optimizer takes them); schedules write the rate there and the step reads it.
        self.optimizer = STAGES[cfg.zero_optimization.stage](model, param_groups=groups, **self._stage_kwargs(adam))
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
        """Every rank starts from rank 0's parameters, as DeepSpeed's engine makes them
        (``_broadcast_model`` in deepspeed/runtime/engine.py): a script that seeds per rank, or not at
        all, or edits weights on rank 0 only, still trains one model. Parameters that zero.Init has
        partitioned are skipped (Init took them from rank 0 already); buffers are not sent (nor in
        DeepSpeed)."""
        if self.dp_world_size == 1:
            return
        src = dist.get_global_rank(self.dp_group, 0)
        with torch.no_grad():
            for p in self.module.parameters():
                if not hasattr(p, "_z3_unit"):
                    comm.broadcast(p.data, src=src, group=self.dp_group)

    def _take_from_deepspeeds_zero_init(self) -> None:
        """transformers' ZeRO-3 path (``HfDeepSpeedConfig`` kept alive, then ``from_pretrained``) builds the model
        inside DeepSpeed's own ``zero.Init``: its parameters arrive partitioned by DeepSpeed (``ds_id``,
        ``ds_tensor``; ``param.data`` empty). Their full values are gathered once with DeepSpeed's
        ``GatheredParameters`` and DeepSpeed's attributes removed, so zero_ref's stage partitions plain
        parameters (at ZeRO-3, its own way) and trains the model DeepSpeed would."""
        taken = [p for p in self.module.parameters() if hasattr(p, "ds_id")]
        if not taken:
            return
        import deepspeed  # (only such a model brings DeepSpeed in: it made these parameters)
        with deepspeed.zero.GatheredParameters(taken):
            full = [p.data.detach().clone() for p in taken]
        for p, data in zip(taken, full):
            p.data = data
            for name, value in list(vars(p).items()):  # ds_* state and the methods zero.Init attached
                if name.startswith("ds_") or name in ("is_external_param", "nvme_swapper") or callable(value):
                    delattr(p, name)

    @staticmethod
    def _refuse_expert_parallel(model: nn.Module) -> None:
        """The stages average every gradient over all data-parallel ranks: right for an expert only when every
        rank holds every expert (ep_size 1). DeepSpeed reduces expert gradients over their own group instead."""
        from zero_ref.moe.layer import MoE
        ep = max((m.ep_size for m in model.modules() if isinstance(m, MoE)), default=1)
        if ep > 1:
            raise ValueError(f"initialize: an MoE layer with ep_size={ep} is not supported by zero_ref's engine, whose "
                             "stages average every gradient over all data-parallel ranks (DeepSpeed averages expert "
                             "gradients over their expert-data-parallel group); use ep_size=1, or train the layer "
                             "by hand with zero_ref.parallel.moe.reduce_gradients")

    def _adam(self, optimizer, model_parameters) -> tuple[AdamConfig, list[dict] | None, object]:
        """Adam's hyper-parameters from the client optimizer or the config's optimizer section, and the
        param groups (None: one group of every trainable parameter)."""
        cfg = self.config
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        groups = None
        if model_parameters is not None:
            model_parameters = list(model_parameters)  # a generator (model.parameters()) is read once
            given = [p for g in model_parameters for p in (g["params"] if isinstance(g, dict) else [g])]
            self._check_params(given, trainable, "model_parameters")
            if any(isinstance(g, dict) for g in model_parameters):  # groups with their own weight decay, lr, ...
                groups = [g if isinstance(g, dict) else {"params": [g]} for g in model_parameters]
        if optimizer is None:
            if cfg.optimizer is None:
                raise ConfigError("optimizer", "optimizer: none given; add an \"optimizer\" section ({\"type\": "
                                               "\"AdamW\", \"params\": {\"lr\": 1e-3}}) or pass optimizer="
                                               "torch.optim.AdamW(...) to initialize")
            o = cfg.optimizer
            p = o.params
            return AdamConfig(lr=p.lr, betas=p.betas, eps=p.eps, weight_decay=o.weight_decay, adamw=o.adamw), groups, None
        if not isinstance(optimizer, torch.optim.Optimizer) and callable(optimizer):
            optimizer = optimizer(model_parameters if model_parameters is not None else trainable)  # DeepSpeed's callable
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError("optimizer", f"optimizer= must be a torch.optim.Adam or AdamW (or a callable "
                                           f"making one), got {type(optimizer).__name__}")
        if not isinstance(optimizer, (torch.optim.AdamW, torch.optim.Adam)):
            allowed = (" zero_allow_untested_optimizer lets DeepSpeed try an untested optimizer; zero_ref has no "
                       "other optimizer to run." if cfg.zero_allow_untested_optimizer else "")
            raise ConfigError("optimizer", f"optimizer={type(optimizer).__name__} is not supported by zero_ref: its "
                                           f"stages step Adam(W) on their partitions; use torch.optim.AdamW or an "
                                           f"\"optimizer\" config section.{allowed}")
        off = cfg.zero_optimization.offload_optimizer
        from zero_ref.ops.adam import DeepSpeedCPUAdam  # DeepSpeed takes its own CPU Adam with offload
        if (off is not None and off.device != "none" and cfg.zero_force_ds_cpu_optimizer
                and not isinstance(optimizer, DeepSpeedCPUAdam)):
            raise ConfigError("zero_force_ds_cpu_optimizer", "zero_force_ds_cpu_optimizer is true (the default) and "
                                                             "ZeRO-Offload got a client optimizer, which DeepSpeed "
                                                             "refuses too: set an \"optimizer\" config section instead, "
                                                             "or set \"zero_force_ds_cpu_optimizer\": false")
        if cfg.optimizer is not None and self.dp_rank == 0:
            print("[zero_ref] note: optimizer= was passed, so the config's \"optimizer\" section is not used "
                  "(as in DeepSpeed)")
        groups = optimizer.param_groups
        self._check_params([p for g in groups for p in g["params"]], trainable, "the optimizer's parameters")
        if any(g.get("amsgrad") or g.get("maximize") for g in groups):
            raise ConfigError("optimizer", "optimizer: amsgrad / maximize are not supported by zero_ref")
        # torch's Adam(decoupled_weight_decay=True) is AdamW (and AdamW is an Adam subclass): read the flag, not the class
        decoupled = {g.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW)) for g in groups}
        if len(decoupled) > 1:
            raise ConfigError("optimizer", "optimizer: param groups mix decoupled_weight_decay=True and False; "
                                           "zero_ref steps one Adam mode for all groups")
        first = groups[0]
        adam = AdamConfig(lr=float(first["lr"]), betas=tuple(first["betas"]), eps=first["eps"],
                          weight_decay=first["weight_decay"], adamw=decoupled.pop())
        # each group keeps its own hyper-parameters; the stage steps it with them
        return adam, [{"params": g["params"], **{k: g[k] for k in HYPERPARAMETERS}} for g in groups], optimizer

    def _check_params(self, given, trainable, what: str) -> None:
        """``given`` must be parameters of the module with requires_grad=True. Those it leaves out are not
        trained, as in DeepSpeed (bing_bert leaves its pooler out): zero_ref freezes them, which trains the
        same model and spends no gradient memory on them."""
        given_ids = {id(p) for p in given}
        if not given_ids <= {id(p) for p in trainable}:
            raise ConfigError("model_parameters", f"{what} hold a tensor that is not one of the module's parameters "
                                                  "with requires_grad=True")
        left_out = [n for n, p in self.module.named_parameters() if p.requires_grad and id(p) not in given_ids]
        for n in left_out:
            self.module.get_parameter(n).requires_grad_(False)
        if left_out and self.dp_rank == 0:
            print(f"[zero_ref] note: {what} leave out {len(left_out)} trainable parameter(s) "
                  f"({', '.join(left_out[:3])}{', ...' if len(left_out) > 3 else ''}): they are not trained, as in "
                  "DeepSpeed, and zero_ref sets requires_grad=False on them")

    def _stage_kwargs(self, adam: AdamConfig) -> dict:
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
                      max_reuse_distance=z.stage3_max_reuse_distance)
        return kw

    def _scheduler(self, client):
        """The client's scheduler (or callable), else the config's; None if neither."""
        if client is not None:
            if callable(client) and not hasattr(client, "step"):
                return client(self.client_optimizer or self.optimizer)  # DeepSpeed's scheduler callable
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
        them runs as ``engine.backward(loss)`` does (see the note above ``_hook_outputs``)."""
        start = time.perf_counter()
        out = self.module(*args, **kwargs)
        if self._hook_outputs(out):
            self._forwards += 1
        self._times["forward"] += time.perf_counter() - start
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backward of loss / gradient_accumulation_steps (× the fp16 loss scale); gradients are
        reduced (stage 0/1: at the boundary; stage 2/3: every micro-step) by the stage. Returns the loss
        divided by gradient_accumulation_steps, as DeepSpeed's does.

        As DeepSpeed's (``DeepSpeedEngine.backward``, deepspeed/runtime/engine.py): ``retain_graph`` is handed
        to autograd, and ``scale_wrt_gas=False`` leaves the loss undivided (the script has divided it).
        Several backwards before one ``step()`` add up: see ``_again``."""
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
        return loss / self.gradient_accumulation_steps() if scale_wrt_gas else loss

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times the fp16 loss scale, for a script that calls ``engine.scale(loss).backward()``; the
        loss itself in fp32 and bf16 (no loss scale). As DeepSpeed's ``DeepSpeedEngine.scale``
        (deepspeed/runtime/engine.py, through ``ZeROOptimizer.scale_if_loss``): with fp16, a plain
        ``loss.backward()`` is refused."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError("scale: loss must be a scalar tensor with a grad_fn; for a non-scalar tensor call "
                             "tensor.backward(grad) on the output of engine(...)")
        self._scaled = True
        return loss * self.optimizer.loss_scale if self.config.precision == "fp16" else loss

    # ``loss.backward()`` on what ``engine(...)`` returned, then ``engine.step()``, as DeepSpeed 0.19.8 allows it
    # at ZeRO stages 1-3 (``DeepSpeedEngine.forward`` hooks the outputs with ``register_output_backward_hooks``,
    # deepspeed/runtime/utils.py; its first hook runs ``_backward_prologue``, and ``_backward_epilogue`` runs
    # once autograd is done). Here a hook on each output that needs gradients opens the backward (the stage's
    # ``begin_backward``: is it the boundary? reduce in this backward?) and queues its end on autograd's
    # engine (``queue_callback``, as FSDP does), where the stage reduces what is still due and counts the
    # micro-step: the stage's own code paths, whichever backward the script calls. The 1/GAS scaling is done
    # on each trainable parameter's gradient (a pre-accumulation hook), once per backward: DeepSpeed divides
    # the gradient of every output instead, so a model returning (logits, loss) gets 1/GAS twice on loss's
    # path at ZeRO-1/2 (its gradient norm comes out halved at GAS 2, measured); here both ways give the gradients
    # ``engine.backward(loss)`` gives (bit for bit at a power-of-two GAS). A loss term reaching the parameters
    # before any output (a penalty on the weights added outside the model) opens the backward from the
    # parameter's hook, as long as ``engine(...)`` ran since the last backward.
    def _hook_outputs(self, out) -> bool:
        """Hook every tensor in ``out`` (nested tuples, lists, dicts) that needs gradients; True if any."""
        if isinstance(out, torch.Tensor):
            if out.requires_grad and out.grad_fn is not None:
                out.register_hook(self._output_grad)
                return True
            return False
        values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
        return any([self._hook_outputs(v) for v in values])  # (a list: hook them all)

    def _hook_parameters(self) -> None:
        self._trainable = [p for p in self.module.parameters() if p.requires_grad]
        for p in self._trainable:
            p.register_hook(partial(self._param_grad, p))

    def _output_grad(self, grad: torch.Tensor) -> None:
        if self._in_engine_backward or self._torch_backward == torch._C._current_graph_task_id():
            return  # engine.backward's own, or this backward is open already
        if any(self._accumulates_into(p) for p in self._trainable):
            self._begin_torch_backward()
        # else torch.autograd.grad (a gradient penalty) or a backward(inputs=...) that leaves the parameters alone

    def _param_grad(self, p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor | None:
        if self._in_engine_backward or not self._accumulates_into(p):
            return None  # engine.backward divided the loss itself; torch.autograd.grad is not training
        if self._torch_backward is None:
            if not self._forwards:
                raise RuntimeError(
                    "a backward reached the model's parameters, but engine(...) has not run since the last backward: "
                    "call backward on what engine(...) returned (loss.backward() or engine.backward(loss)), not on "
                    "the output of the module called directly")
            self._begin_torch_backward()
        gas = self.gradient_accumulation_steps()
        return None if gas == 1 else grad / gas

    @staticmethod
    def _accumulates_into(p: torch.Tensor) -> bool:
        """Will the running backward accumulate into ``p.grad``? (False under ``torch.autograd.grad``.)"""
        with torch.enable_grad():
            node = torch.autograd.graph._get_grad_fn_or_grad_acc(p)
        try:
            return bool(torch._C._will_engine_execute_node(node))
        except RuntimeError:  # "... we are currently running autograd.grad()"
            return False

    def _begin_torch_backward(self) -> None:
        """A ``loss.backward()`` begins: DeepSpeed's refusals, then the stage's ``begin_backward``."""
        self._drop_failed_backward()
        stage = self.zero_optimization_stage()
        if stage == 0:
            raise RuntimeError("loss.backward() at ZeRO stage 0 is refused, as DeepSpeed 0.19.8 refuses it (\"Direct "
                               "calls to tensor.backward() are not supported in this configuration\": its stage-0 "
                               "optimizer is not a ZeRO optimizer, DeepSpeedEngine._backward_prologue): call "
                               "engine.backward(loss), or use ZeRO stage 1-3")
        if self.config.precision == "fp16" and not self._scaled:
            raise RuntimeError("fp16: loss.backward() without the loss scale; call engine.scale(loss).backward() or "
                               "engine.backward(loss) (DeepSpeed raises \"Loss scaling is required\" with a dynamic "
                               "scale, and with a static one divides unscaled gradients by it)")
        self._scaled = False
        self.optimizer.begin_backward(reduce=not self._no_sync, again=self._again())
        self._torch_backward = torch._C._current_graph_task_id()
        self._backward_start = time.perf_counter()
        torch.autograd.Variable._execution_engine.queue_callback(self._end_torch_backward)

    def _drop_failed_backward(self) -> None:
        """A loss.backward() that raised never reached its end: release what the stage held for it."""
        if self._torch_backward is not None:
            self._torch_backward = None
            self.optimizer.end_backward(failed=True)

    def _end_torch_backward(self) -> None:
        """Autograd has finished the backward: the stage reduces what is due and counts the micro-step."""
        self._torch_backward = None
        self.optimizer.end_backward()
        self._times["backward"] += time.perf_counter() - self._backward_start

    def _again(self) -> bool:
        """True if the backward about to run belongs to a micro-batch that has had its backward already.

        Several backwards before one ``engine.step()`` (a GAN's ``engine.backward(loss_real)``,
        ``engine.backward(loss_fake)``; or through one graph with ``retain_graph=True``) train as one backward
        of their sum: the stage keeps the micro-step's boundary and reopens gradients it has reduced already
        (``begin_backward(again=True)``). DeepSpeed 0.19.8 takes them too (its engine counts micro-steps in
        ``step()`` only); its ZeRO-0 result is the sum's, but at ZeRO-1/2 its gradient norm comes out
        different (0.38 where one backward of the same loss gives 0.99, tests/test_engine.py's model at
        GAS 2) and at ZeRO-3 the second backward fails. Inside ``no_sync()`` nothing is counted."""
        self._forwards = 0
        return not self._no_sync and self.optimizer.micro_steps == self.micro_steps + 1

    @contextmanager
    def no_sync(self):
        """DeepSpeed's ``engine.no_sync()``: backwards inside only accumulate this rank's gradients (no
        reduction, no micro-step counted); the next backward outside reduces them with its own. Stages 0–1
        only (ZeRO-2/3 partition gradients by reducing them: DeepSpeed asserts the same), not re-entrant,
        and ``step()`` inside is an error, as in DeepSpeed (runtime/engine.py, ``no_sync`` and ``step``)."""
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

    def is_gradient_accumulation_boundary(self) -> bool:
        """True during the last micro-batch of an optimizer step (its backward and its step())."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def step(self, lr_kwargs: dict | None = None) -> None:
        """At the accumulation boundary: the stage's step (unscale, overflow check, clip, Adam), then
        the schedule (if the step was applied: an fp16 overflow skips both); always count the micro-step."""
        if self._no_sync:
            raise RuntimeError("engine.step() inside no_sync(): step after the context, once a backward outside it "
                               "has reduced the gradients (DeepSpeed refuses it too)")
        if self.optimizer.micro_steps != self.micro_steps + 1:
            raise RuntimeError("engine.step() must follow exactly one backward per micro-batch: engine.backward(loss), "
                               "or loss.backward() on what engine(...) returned (a backward that reached none of the "
                               "model's trainable parameters does not count; backwards so far: "
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
        """Gradients are cleared by the stage after each step; this exists for drop-in loops."""

    # ------------------------------------------------------------ accessors (DeepSpeed's names)
    def train_batch_size(self) -> int:
        return self.config.batch.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.batch.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.config.batch.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self.config.zero_optimization.stage

    def zero_optimization(self) -> bool:
        return self.zero_optimization_stage() > 0

    def fp16_enabled(self) -> bool:
        return self.config.fp16.enabled

    def bfloat16_enabled(self) -> bool:
        return self.config.bf16.enabled

    def gradient_clipping(self) -> float:
        return self.config.gradient_clipping

    def steps_per_print(self) -> int | None:
        return self.config.steps_per_print

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self._lr_source.param_groups]

    def get_mom(self) -> list:
        return [g["betas"] for g in self._lr_source.param_groups]

    def get_global_grad_norm(self) -> float | None:
        return self.optimizer.last_grad_norm

    def was_step_applied(self) -> bool:
        return self._step_applied

    @property
    def loss_scale(self) -> float:
        return self.optimizer.loss_scale

    def __getattr__(self, name: str):
        """The module's attributes through the engine (``engine.config_of_my_model``), as DeepSpeed's
        engine passes them through when it has no attribute of that name itself."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is not None and name != "module":
                try:
                    return getattr(module, name)
                except AttributeError:
                    pass
            raise AttributeError(f"'{type(self).__name__}' object (nor its module) has no attribute '{name}'") from None

    def destroy(self) -> None:
        """DeepSpeed releases its buffers and compiled state here; zero_ref's stage waits for its collectives."""
        self.optimizer._wait_all()

    # ------------------------------------------------------------ checkpoints (zero_ref.checkpoint)
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
        from zero_ref import checkpoint
        return checkpoint.save(self, save_dir, tag, client_state, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False, custom_load_fn=None):
        """``(load_path, client_state)``. Delegates to ``zero_ref.checkpoint.load``; DeepSpeed's argument order."""
        if not load_module_strict or custom_load_fn is not None:
            raise ValueError("load_checkpoint: load_module_strict=False and custom_load_fn are not supported by zero_ref")
        if load_module_only:
            load_optimizer_states = load_lr_scheduler_states = False
        from zero_ref import checkpoint
        return checkpoint.load(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states)
