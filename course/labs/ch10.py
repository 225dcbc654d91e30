"""Chapter 10's harness: the rank functions of the graded checks of Tasks 10.1 and 10.2.

They run under ``zero_ref.launch`` (cloudpickle sends them by name, so the child imports this module);
the student's code, the model config and the learning rate come in as arguments.
"""
import torch

from course.labs.deepspeed_cpu import import_deepspeed
from zero_ref.models import GPT, make_batch


def port_on_ranks(rank, world, port, data, folder):
    """A port (Task 10.1) on this rank: 4 steps on zero_ref, 2 + 2 through a checkpoint in folder, 4 on DeepSpeed."""
    import zero_ref.ds
    straight = port(zero_ref.ds, data, 4)
    resumed = port(zero_ref.ds, data, 2, save_dir=folder) + port(zero_ref.ds, data, 2, load_dir=folder)
    return straight, resumed, port(import_deepspeed(), data, 4)


def per_step(runs, steps=4):
    """The loss of each optimizer step: the mean over the ranks' runs and the micro-batches of the step."""
    k = len(runs[0]) // steps
    return [sum(sum(r[s * k:(s + 1) * k]) for r in runs) / (k * len(runs)) for s in range(steps)]


def flat_weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def wrapper_on_ranks(rank, world, engine_class, cfg, lr, micro, gas, steps):
    """The ported loop (micro × gas, `steps` optimizer steps) with engine_class under SGD and AdamW, and with
    zero_ref's engine under AdamW: {who: (weights, global_steps after each micro-step)}."""
    import zero_ref
    out = {}
    for who in ("yours, SGD", "yours, AdamW", "zero_ref, AdamW"):
        torch.manual_seed(0)
        model = GPT(cfg)
        if who.endswith("SGD"):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        if who.startswith("zero_ref"):
            engine, *_ = zero_ref.initialize(model=model, optimizer=optimizer, config={
                "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas, "gradient_clipping": 0.0})
        else:
            engine = engine_class(model, optimizer, gas)
        counts = []
        for step in range(steps):
            idx, targets = make_batch(cfg, micro * gas * world, seed=10 + step)
            for m in range(gas):
                lo = (m * world + rank) * micro
                _, loss = engine(idx[lo:lo + micro], targets[lo:lo + micro])
                engine.backward(loss)
                engine.step()
                counts.append(int(engine.global_steps))
        out[who] = flat_weights(model), counts
    return out


def plain_sgd(cfg, size, steps):
    """One process, the whole global batch of `size`, `steps` SGD steps (lr 0.5): the weights."""
    torch.manual_seed(0)
    model = GPT(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        _, loss = model(*make_batch(cfg, size, seed=10 + step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat_weights(model)
