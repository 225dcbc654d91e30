"""Chapter 10: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # GAS written down from the world size, a for loop over epochs, float(), a named checkpoint tag
    "10.1": '''
import torch.distributed as dist
model, optimizer, scheduler = build()
gas = 8 // (2 * dist.get_world_size())
engine, _, loader, _ = ds.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, training_data=data,
                                     config=dict(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=gas,
                                                 gradient_clipping=0, zero_optimization=dict(stage=2)))
if load_dir:
    engine.load_checkpoint(load_dir, tag="end")
out = []
for _ in range(steps):
    for batch in loader:
        loss = engine(*batch)[1]
        engine.backward(loss)
        engine.step()
        out.append(float(loss))
if save_dir:
    engine.save_checkpoint(save_dir, tag="end")
return out
''',
    # Task 10.2: the reduction in step() instead of backward, one flat buffer, torch.distributed directly
    "10.2": '''
def backward(self, loss):
    loss.div(self.gas).backward()
    return loss

def step(self):
    import torch
    import torch.distributed as dist
    if (self.micro_steps + 1) % self.gas == 0:
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads]) / dist.get_world_size(self.group)
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_steps = self.global_steps + 1
    self.micro_steps = self.micro_steps + 1
''',
}

# The port with the config's other keys right and one thing wrong (10.1), written once and varied below.
_PORT = '''
model, optimizer, scheduler = build()
config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
          "zero_optimization": {"stage": 2}}
engine, _, loader, _ = ds.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                     training_data=data, config=config)
if load_dir is not None:
    engine.load_checkpoint(load_dir)
losses, end = [], engine.global_steps + steps
while engine.global_steps < end:
    for idx, targets in loader:
        _, loss = engine(idx, targets)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
if save_dir is not None:
    engine.save_checkpoint(save_dir)
return losses
'''


def _port(old, new):
    assert old in _PORT, old
    return _PORT.replace(old, new)


MORE_WRONG = [
    # DeepSpeed's default gradient_clipping (1.0) kept: WIDE's gradient norm is above 1, the curves part at step 3
    {"10.1": _port('"gradient_clipping": 0.0,', '')},
    # every rank reads the whole dataset with its own DataLoader: both ranks train on the same sequences
    {"10.1": _port("    for idx, targets in loader:", "    from torch.utils.data import DataLoader\n"
                                                     "    for idx, targets in DataLoader(data, batch_size=2):")},
    # only the micro-batch given: GAS 1, a global batch of 4, two optimizer steps per epoch of the script
    {"10.1": _port('"train_batch_size": 8, ', '')},
    # the schedule kept outside the engine and stepped by hand: the checkpoint does not hold it, the resumed run
    # restarts the warm-up
    {"10.1": _port("optimizer=optimizer, lr_scheduler=scheduler,", "optimizer=optimizer,").replace(
        "        engine.step()\n", "        boundary = engine.is_gradient_accumulation_boundary()\n"
                                  "        engine.step()\n        if boundary:\n            scheduler.step()\n")},
    # the resume loads the weights only: Adam's moments and the schedule start over
    {"10.1": _port("engine.load_checkpoint(load_dir)",
                   "engine.load_checkpoint(load_dir, load_optimizer_states=False, load_lr_scheduler_states=False)")},
    # the micro-batch losses not scaled by 1/GAS: the accumulated gradient is GAS times the mean; AdamW barely
    # notices (nearly scale-free), SGD takes 3× the step (the one-process SGD check fails it)
    {"10.2": '''
def backward(self, loss):
    loss.backward()
    if self.is_gradient_accumulation_boundary():
        world = comm.get_world_size(self.group)
        for p in self.module.parameters():
            if p.grad is not None:
                comm.all_reduce(p.grad, group=self.group)
                p.grad /= world
    return loss

def step(self):
    if self.is_gradient_accumulation_boundary():
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.global_steps += 1
    self.micro_steps += 1
'''},
    # the optimizer stepped on every micro-step (global_steps still counted at the boundary): GAS small steps on
    # a third of the gradient each, not one step on the mean (both weight checks fail it)
    {"10.2": '''
def backward(self, loss):
    (loss / self.gas).backward()
    world = comm.get_world_size(self.group)
    for p in self.module.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad, group=self.group)
            p.grad /= world
    return loss

def step(self):
    self.optimizer.step()
    self.optimizer.zero_grad()
    if self.is_gradient_accumulation_boundary():
        self.global_steps += 1
    self.micro_steps += 1
'''},
]
