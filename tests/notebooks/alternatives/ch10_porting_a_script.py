"""Chapter 10: answers in another style than the reference's (RIGHT must pass), and mistakes (WRONG must fail)."""

RIGHT = {
    # engine.backward returns the loss; float() instead of .item(); a tuple instead of a list
    "10.1": '''
out = []
for batch in batches:
    loss = engine.backward(engine(*batch)[1])
    engine.step()
    out.append(float(loss))
return tuple(out)
''',
    # numpy: the boundary flags as an array, the step count as a float
    "10.2": '''
import numpy as np
return (np.arange(n) + 1) % gas == 0, float(n // gas)
''',
}

WRONG = {
    # each rank takes one contiguous block for all its micro-steps: every row once, but not the script's slices
    "10.3": '''
per = global_size // (world * gas)
return {(r, m): ((r * gas + m) * per, (r * gas + m + 1) * per) for r in range(world) for m in range(gas)}
''',
}

# Task 10.4: the reduction in step() instead of backward, one flat buffer, torch.distributed directly
RIGHT["10.4"] = '''
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
'''

# More mistakes, for tasks that already have an answer above: each is graded in a release of its own.
MORE_WRONG = [
    # the micro-batch losses not scaled by 1/GAS: the accumulated gradient is GAS times the mean; AdamW barely
    # notices (nearly scale-free), SGD takes 3× the step (the one-process SGD check fails it)
    {"10.4": '''
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
    {"10.4": '''
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
