"""DeepSpeed's stage-0 optimizer state dict, on zero_ref's ``DataParallel`` (what ``engine.optimizer`` is at stage 0).

``state_dict()`` / ``load_state_dict()`` have the shape of the optimizer DeepSpeed's engine returns at
stage 0 (deepspeed/runtime/engine.py, ``_configure_optimizer``: no ZeRO wrapper). In fp32 that is the
basic optimizer itself, so the dict is ``torch.optim.AdamW``'s (``Adam``'s without decoupled decay):
per parameter ``step``, ``exp_avg``, ``exp_avg_sq``, and the param groups; it loads into a torch AdamW
over the same parameters and back. In bf16 and fp16 DeepSpeed wraps it in
``FP16_UnfusedOptimizer`` (runtime/fp16/unfused_optimizer.py, ``state_dict``; the wrapper it takes with
torch's AdamW, ``"torch_adam": true``): the loss-scale fields, the inner optimizer's dict over the fp32
master weights as ``optimizer_state_dict``, and those masters as ``fp32_groups``. Two differences: with
FusedAdam DeepSpeed's fused wrapper (runtime/fp16/fused_optimizer.py) keeps one flat tensor per group
instead, and both wrappers take one step with zero gradients when they are built
(``initialize_optimizer_states``), so their ``step`` is one higher than the Adam steps taken; here
``step`` counts the steps taken.
"""
import torch

from zero_ref.stages.param_groups import HYPERPARAMETERS
from zero_ref.stages.ddp import DataParallel

__all__ = ["Stage0Optimizer"]


class Stage0Optimizer(DataParallel):
    """``DataParallel`` whose ``state_dict()`` / ``load_state_dict()`` have DeepSpeed's stage-0 shape."""

    def _views(self, which: str) -> dict[int, torch.Tensor]:
        """Parameter id → its view of the full ``which`` buffer (master, exp_avg, exp_avg_sq)."""
        return {id(p): v for b in self.buckets
                for p, v in zip(b.params, b.layout.unflatten(getattr(b.partition, which)))}

    def _torch_twin(self, params: list[list[torch.Tensor]]) -> torch.optim.Optimizer:
        """A torch Adam(W) over ``params`` (one list per group) with each group's hyper-parameters and extra
        keys: it lays the state dict out (and checks one on load) exactly as torch's own optimizer does."""
        cls = torch.optim.AdamW if self.adam.adamw else torch.optim.Adam
        return cls([{**{k: v for k, v in g.items() if k != "params"}, "params": ps}
                    for g, ps in zip(self.param_groups, params)])

    def _mixed(self) -> bool:
        return self.precision != "fp32"

    def _client_only(self) -> None:
        if self._mixed():
            raise NotImplementedError(f"optimizer.state_dict() with {self.client.name} in {self.precision}: DeepSpeed "
                                      "wraps it in its FP16 optimizer there; zero_ref keeps that state in "
                                      "engine.save_checkpoint(dir) / engine.load_checkpoint(dir), so use those")

    def state_dict(self) -> dict:
        """The optimizer state in DeepSpeed's stage-0 shape (see the module docstring); tensors are copies. A
        client optimizer that is not Adam: its own ``state_dict()`` (fp32; DeepSpeed returns it itself)."""
        if self.client is not None:
            self._client_only()
            return self.client_optimizer.state_dict()
        masters = self._views("master")
        keys = [[masters[id(p)].detach().clone() if self._mixed() else p for p in g["params"]]
                for g in self.param_groups]  # what the inner optimizer steps: the fp32 masters, or the parameters
        twin = self._torch_twin(keys)
        if self.adam_steps:  # (torch keeps no state before the first step)
            moments = {k: self._views(k) for k in ("exp_avg", "exp_avg_sq")}
            for g, ps in zip(self.param_groups, keys):
                for p, key in zip(g["params"], ps):
                    twin.state[key] = {"step": torch.tensor(float(self.adam_steps)),
                                       **{k: v[id(p)].detach().clone() for k, v in moments.items()}}
        inner = twin.state_dict()
        if not self._mixed():
            return inner
        scaler = self.loss_scaler
        dynamic = bool(getattr(scaler, "dynamic", False))
        out = {"dynamic_loss_scale": dynamic, "cur_scale": self.loss_scale,
               "cur_iter": scaler.cur_iter if dynamic else self.adam_steps + self.skipped_steps}
        if dynamic:
            out.update(last_overflow_iter=scaler.last_overflow_iter, scale_factor=scaler.scale_factor,
                       scale_window=scaler.scale_window)
        return {**out, "optimizer_state_dict": inner, "fp32_groups": keys}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what ``state_dict()`` returned (or torch's AdamW / DeepSpeed's stage-0 optimizer over the same
        parameters): moments, step, each group's hyper-parameters and, in bf16/fp16, the fp32 masters and the
        loss scale. torch's own ``load_state_dict`` checks the groups and sizes."""
        if self.client is not None:
            self._client_only()
            return self.client_optimizer.load_state_dict(state_dict)
        mixed = self._mixed()
        if mixed != ("optimizer_state_dict" in state_dict):
            raise ValueError(f"load_state_dict: this optimizer trains in {self.precision}, which takes "
                             + ("DeepSpeed's FP16 wrapper's dict (optimizer_state_dict, fp32_groups, the loss scale)"
                                if mixed else "torch AdamW's dict (state, param_groups)")
                             + f"; got one with keys {sorted(state_dict)}")
        keys = [[torch.empty_like(p, dtype=torch.float32) for p in g["params"]] for g in self.param_groups]
        twin = self._torch_twin(keys)
        twin.load_state_dict(state_dict["optimizer_state_dict"] if mixed else state_dict)
        steps = {float(twin.state[k]["step"]) for ps in keys for k in ps if k in twin.state}
        if len(steps) > 1:
            raise ValueError(f"load_state_dict: the parameters were saved at different steps {sorted(steps)}; "
                             "zero_ref steps all of them together")
        moments = {k: self._views(k) for k in ("exp_avg", "exp_avg_sq")}
        masters = self._views("master")
        with torch.no_grad():
            for i, (g, loaded, ps) in enumerate(zip(self.param_groups, twin.param_groups, keys)):
                g.update({k: loaded[k] for k in HYPERPARAMETERS})
                for j, (p, key) in enumerate(zip(g["params"], ps)):
                    for k, views in moments.items():
                        views[id(p)].copy_(twin.state[key][k] if key in twin.state else torch.zeros(()))
                    if mixed:
                        masters[id(p)].copy_(state_dict["fp32_groups"][i][j])
        self.adam_steps = int(steps.pop()) if steps else 0
        if mixed:
            self.publish_params()  # the parameters are the masters cast down
            if getattr(self.loss_scaler, "dynamic", False):
                for k in ("cur_scale", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window"):
                    if k in state_dict:
                        setattr(self.loss_scaler, k, state_dict[k])
            elif self.loss_scaler is not None:
                self.loss_scaler.cur_scale = float(state_dict["cur_scale"])
