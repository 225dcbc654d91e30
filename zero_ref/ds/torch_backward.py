"""``loss.backward()`` on what ``engine(...)`` returned, run as ``engine.backward(loss)`` (ZeRO stages 1-3).

A hook on each output that needs gradients opens the backward (the stage's ``begin_backward``: is it
the boundary? reduce in this backward?) and queues its end on autograd's engine (``queue_callback``, as
FSDP does), where the stage reduces what is still due and counts the micro-step: the stage's own code
paths, whichever backward the script calls. The 1/GAS scaling is done on each trainable parameter's
gradient (a pre-accumulation hook), once per backward, so both ways give the gradients
``engine.backward(loss)`` gives. A loss term reaching the parameters before any output (a penalty on the
weights added outside the model) opens the backward from the parameter's hook, as long as
``engine(...)`` ran since the last backward.

A backward that reaches the parameters when ``engine(...)`` has not run since the last backward comes from
outside the engine: the module called directly, as a GAN's generator loss flows back through
``netD(fake)`` into the discriminator under the generator's engine. Its gradients accumulate into
``param.grad`` undivided and unreduced, as a plain module's do and as in DeepSpeed's stage 0; a
``module.zero_grad()`` clears them, else the engine's next backward adds to them and reduces the sum.

This rests on four private torch APIs (``torch._C._current_graph_task_id``,
``torch.autograd.graph._get_grad_fn_or_grad_acc``, ``torch._C._will_engine_execute_node``,
``Variable._execution_engine.queue_callback``); a reader of the engine can skip this file.
"""
from __future__ import annotations

import time
from functools import partial

import torch


class TorchBackward:
    """The hooks that turn a script's ``loss.backward()`` into the stage's backward (mixed into ``Engine``)."""

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
                return None  # from outside the engine: into param.grad, as a plain module's (the module docstring)
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
