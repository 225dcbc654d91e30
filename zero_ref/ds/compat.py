"""The parts of DeepSpeed's engine API that are not about training: a reader of the engine can skip this file.

Refusals of DeepSpeed features zero_ref does not have (AutoTP, the inference engine), the command-line
arguments, the client optimizer (read as Adam(W) hyper-parameters, or stepped as itself), models built by
DeepSpeed's own ``zero.Init`` (transformers' ZeRO-3 path), and the engine's one-line accessors under DeepSpeed's
names.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from zero_ref.config import ConfigError
from zero_ref.ds.moe.layer import MoE
from zero_ref.optim import AdamConfig
from zero_ref.stages.param_groups import HYPERPARAMETERS

AUTOTP = ("DeepSpeed's AutoTP (tp_model_init, tensor_parallel.autotp_size) shards a HuggingFace model's linear "
          "layers over tensor-parallel ranks; zero_ref has no AutoTP. Its tensor parallelism is Megatron-style "
          "modules for its own GPT (zero_ref.parallel.tensor.TensorParallelGPT, chapter 19), composed with pipeline "
          "and data parallelism by hand (zero_ref.recipes.three_d); the engine runs data parallelism with ZeRO "
          "0-3 and, for a zero_ref.ds.pipe.PipelineModule, pipeline parallelism")


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


def config_source(args, config, config_params):
    """The config ``initialize`` was given: ``config=``, its older name ``config_params=``, or
    ``args.deepspeed_config`` (``args.deepscale_config``, deprecated); exactly one of them."""
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
    return config


def adopt_deepspeed_zero_init(module: nn.Module) -> None:
    """transformers' ZeRO-3 path (``HfDeepSpeedConfig`` kept alive, then ``from_pretrained``) builds the model
    inside DeepSpeed's own ``zero.Init``: its parameters arrive partitioned by DeepSpeed (``ds_id``,
    ``ds_tensor``; ``param.data`` empty). Their full values are gathered once with DeepSpeed's
    ``GatheredParameters`` and DeepSpeed's attributes removed, so zero_ref's stage partitions plain
    parameters (at ZeRO-3, its own way) and trains the model DeepSpeed would."""
    taken = [p for p in module.parameters() if hasattr(p, "ds_id")]
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


def refuse_expert_parallel(model: nn.Module) -> None:
    """The stages average every gradient over all data-parallel ranks: right for an expert only when every
    rank holds every expert (ep_size 1). DeepSpeed reduces expert gradients over their own group instead."""
    ep = max((m.ep_size for m in model.modules() if isinstance(m, MoE)), default=1)
    if ep > 1:
        raise ValueError(f"initialize: an MoE layer with ep_size={ep} is not supported by zero_ref's engine, whose "
                         "stages average every gradient over all data-parallel ranks (DeepSpeed averages expert "
                         "gradients over their expert-data-parallel group); use ep_size=1, or train the layer "
                         "by hand with zero_ref.parallel.moe.reduce_gradients")


def client_adam(module: nn.Module, cfg, optimizer, model_parameters,
                verbose: bool) -> tuple[AdamConfig | None, list[dict] | None, object]:
    """Adam's hyper-parameters from the client optimizer or the config's optimizer section, and the
    param groups (None: one group of every trainable parameter); ``verbose`` prints notes. A client
    optimizer that is not Adam(W) as zero_ref steps it (``adam_reading``) gives ``(None, None, optimizer)``:
    the stage runs its own step on the partitions (``zero_ref.stages.client_optimizer``)."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    groups = None
    if model_parameters is not None:
        model_parameters = list(model_parameters)  # a generator (model.parameters()) is read once
        given = [p for g in model_parameters for p in (g["params"] if isinstance(g, dict) else [g])]
        check_params(module, given, trainable, "model_parameters", verbose)
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
        raise ConfigError("optimizer", f"optimizer= must be a torch.optim.Optimizer (or a callable making one), "
                                       f"got {type(optimizer).__name__}")
    check_tested(optimizer, cfg)
    off = cfg.zero_optimization.offload_optimizer
    if (off is not None and off.device != "none" and cfg.zero_force_ds_cpu_optimizer
            and not any(f"{c.__module__}.{c.__qualname__}" in DEEPSPEED_CPU_OPTIMIZERS
                        for c in type(optimizer).__mro__)):  # (an isinstance check, as DeepSpeed's)
        raise ConfigError("zero_force_ds_cpu_optimizer", "zero_force_ds_cpu_optimizer is true (the default) and "
                                                         "ZeRO-Offload got a client optimizer, which DeepSpeed "
                                                         "refuses too: set an \"optimizer\" config section instead, "
                                                         "or set \"zero_force_ds_cpu_optimizer\": false")
    if cfg.optimizer is not None and verbose:
        print("[zero_ref] note: optimizer= was passed, so the config's \"optimizer\" section is not used "
              "(as in DeepSpeed)")
    groups = optimizer.param_groups
    check_params(module, [p for g in groups for p in g["params"]], trainable, "the optimizer's parameters", verbose)
    adam = adam_reading(optimizer)
    if adam is None:
        return None, None, optimizer
    # each group keeps its own hyper-parameters; the stage steps it with them
    return adam, [{"params": g["params"], **{k: g[k] for k in HYPERPARAMETERS}} for g in groups], optimizer


def _name(optimizer) -> str:
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"


# DeepSpeed 0.19.8's ZERO_SUPPORTED_OPTIMIZERS (runtime/zero/utils.py), matched by exact type as its
# is_zero_supported_optimizer does (a subclass is untested), by name so that DeepSpeed need not be imported;
# zero_ref.ds.ops' classes play DeepSpeed's.
DEEPSPEED_ADAMS = {"deepspeed.ops.adam.fused_adam.FusedAdam", "deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam"}
DEEPSPEED_CPU_OPTIMIZERS = {"deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam",
                            "deepspeed.ops.lion.cpu_lion.DeepSpeedCPULion", "zero_ref.ds.ops.adam.DeepSpeedCPUAdam",
                            "zero_ref.ds.ops.lion.DeepSpeedCPULion"}
ZERO_TESTED = {
    "torch.optim.adam.Adam", "torch.optim.adamw.AdamW", "torch.optim.adagrad.Adagrad", *DEEPSPEED_ADAMS,
    "deepspeed.ops.adam.zenflow_cpu_adam.ZenFlowCPUAdam", "deepspeed.ops.adagrad.cpu_adagrad.DeepSpeedCPUAdagrad",
    "deepspeed.ops.lion.cpu_lion.DeepSpeedCPULion", "deepspeed.ops.lion.fused_lion.FusedLion",
    "apex.optimizers.fused_adam.FusedAdam", "deepspeed.runtime.zero.muon.muon_optimizer.MuonWithAuxAdam",
    "zero_ref.ds.ops.adam.FusedAdam", "zero_ref.ds.ops.adam.DeepSpeedCPUAdam",
    "zero_ref.ds.ops.adagrad.DeepSpeedCPUAdagrad", "zero_ref.ds.ops.lion.DeepSpeedCPULion",
    "zero_ref.ds.ops.lion.FusedLion"}
TESTED_NAMES = "Adam, AdamW, Adagrad, FusedAdam, DeepSpeedCPUAdam, ZenFlowCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion, FusedLion"


def check_tested(optimizer: torch.optim.Optimizer, cfg) -> None:
    """DeepSpeed's rule (runtime/engine.py, ``_do_optimizer_sanity_check``): at ZeRO 1-3 an optimizer off its
    tested list needs ``"zero_allow_untested_optimizer": true``; stage 0 takes any torch optimizer."""
    stage, name = cfg.zero_optimization.stage, type(optimizer).__name__
    if _name(optimizer).endswith(".MuonWithAuxAdam"):
        raise ConfigError("optimizer", "optimizer=MuonWithAuxAdam is not supported by zero_ref: Muon orthogonalises "
                                       "whole matrices, which DeepSpeed's ZeRO optimizer handles apart; zero_ref's "
                                       "partitions cut them. Use AdamW, or another optimizer that works per element")
    if stage > 0 and _name(optimizer) not in ZERO_TESTED and not cfg.zero_allow_untested_optimizer:
        raise ConfigError("zero_allow_untested_optimizer",
                          f"optimizer={name} at ZeRO stage {stage}: You are using an untested ZeRO Optimizer. "
                          "Please add <\"zero_allow_untested_optimizer\": true> in the configuration file to use it. "
                          f"(DeepSpeed's message; its tested list: {TESTED_NAMES}, by exact class)")


def _unwrapped(step):
    """The function under torch's wrappers (each optimizer class's ``step`` gets a profiling hook when its first
    instance is built): a subclass that does not define its own ``step`` runs Adam's."""
    while hasattr(step, "__wrapped__"):
        step = step.__wrapped__
    return step


def adam_reading(optimizer: torch.optim.Optimizer) -> AdamConfig | None:
    """The optimizer as Adam(W) hyper-parameters, when zero_ref's own Adam step is its step (torch's Adam / AdamW
    and zero_ref's or DeepSpeed's FusedAdam / DeepSpeedCPUAdam, bit for bit torch's AdamW arithmetic); None for any
    other optimizer, or a variant zero_ref's Adam does not take (amsgrad, maximize, mixed decay modes): those run
    their own step."""
    groups = optimizer.param_groups
    if _name(optimizer) in DEEPSPEED_ADAMS:  # DeepSpeed's kernels: adam_w_mode on the instance, per-group bias flag
        if not all(g.get("bias_correction", True) for g in groups) or any(g.get("amsgrad") for g in groups):
            raise ConfigError("optimizer", f"optimizer={type(optimizer).__name__}(bias_correction=False or "
                                           "amsgrad=True) is not supported by zero_ref, whose Adam always corrects "
                                           "the bias; use torch.optim.AdamW")
        decoupled = {bool(optimizer.adam_w_mode)}
    elif isinstance(optimizer, torch.optim.Adam) and \
            _unwrapped(type(optimizer).step) is _unwrapped(torch.optim.Adam.step):
        if any(g.get("amsgrad") or g.get("maximize") for g in groups):
            return None
        # torch's Adam(decoupled_weight_decay=True) is AdamW (and AdamW is an Adam subclass): read the flag
        decoupled = {g.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW)) for g in groups}
    else:
        return None
    if len(decoupled) > 1:
        return None
    first = groups[0]
    return AdamConfig(lr=float(first["lr"]), betas=tuple(first["betas"]), eps=first["eps"],
                      weight_decay=first["weight_decay"], adamw=decoupled.pop())


def check_params(module: nn.Module, given, trainable, what: str, verbose: bool) -> None:
    """``given`` must be parameters of the module with requires_grad=True. Those it leaves out are not
    trained, as in DeepSpeed (bing_bert leaves its pooler out): zero_ref freezes them, which trains the
    same model and spends no gradient memory on them."""
    given_ids = {id(p) for p in given}
    if not given_ids <= {id(p) for p in trainable}:
        raise ConfigError("model_parameters", f"{what} hold a tensor that is not one of the module's parameters "
                                              "with requires_grad=True")
    left_out = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in given_ids]
    for n in left_out:
        module.get_parameter(n).requires_grad_(False)
    if left_out and verbose:
        print(f"[zero_ref] note: {what} leave out {len(left_out)} trainable parameter(s) "
              f"({', '.join(left_out[:3])}{', ...' if len(left_out) > 3 else ''}): they are not trained, as in "
              "DeepSpeed, and zero_ref sets requires_grad=False on them")


class Accessors:
    """DeepSpeed's engine accessors (mixed into ``Engine``)."""

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
        """Each group's betas; 0.0 for a group without (SGD), as DeepSpeed's ``_get_optimizer_param`` answers."""
        return [g.get("betas", 0.0) for g in self._lr_source.param_groups]

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
