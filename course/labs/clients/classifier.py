"""A DeepSpeedExamples-style training script (cifar10's shape), on synthetic data.

    torchrun --nproc_per_node=2 -m course.labs.clients.classifier --engine zero_ref --deepspeed_config ds.json

What it uses, as the examples do: ``argparse`` with ``deepspeed.add_config_arguments`` and a
``--deepspeed_config`` file; a model seeded per rank (nanoGPT's ``1337 + rank``: the engine makes every
rank start from rank 0's weights); HF-style param groups in ``model_parameters`` (weight decay on
matrices, none on biases); the config's scheduler; ``engine(x)`` / ``backward`` / ``step``; and a
checkpoint with ``client_state`` half way, loaded again at the end to replay two steps. ``--engine``
picks the import line (``import deepspeed`` or ``import zero_ref.ds as deepspeed``); nothing else differs.
Rank 0 prints ``RESULT {json}``: the losses of every step, then of the two replayed steps.
"""
import argparse
import json
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--engine", choices=("zero_ref", "deepspeed"), default="zero_ref")
    engine, _ = pre.parse_known_args()
    if engine.engine == "deepspeed":
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
    else:
        import zero_ref.ds as deepspeed  # the one line that differs
    parser = argparse.ArgumentParser(description="classifier", parents=[pre])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    return deepspeed, parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(12, 32), nn.LayerNorm(32), nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


def batch(step: int, rank: int, size: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 12, generator=g)
    return x, (x[:, :5].sum(1) > 0).long() + (x[:, 5] > 1).long()


def main():
    deepspeed, args = get_args()
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else None)
    rank = torch.distributed.get_rank()
    torch.manual_seed(1337 + rank)  # per rank, as nanoGPT seeds: the engine broadcasts rank 0's weights
    net = Net()
    groups = [{"params": [p for p in net.parameters() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in net.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    engine, _, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=groups)
    micro = engine.train_micro_batch_size_per_gpu()

    def train_step(step: int) -> float:
        total = 0.0
        for m in range(engine.gradient_accumulation_steps()):
            x, y = batch(step * 10 + m, rank, micro)
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        return total / engine.gradient_accumulation_steps()

    losses, saved_at = [], args.steps // 2
    ckpt = tempfile.mkdtemp() if rank == 0 else None
    obj = [ckpt]
    torch.distributed.broadcast_object_list(obj, src=0)  # every rank writes under one directory
    for step in range(args.steps):
        if step == saved_at:
            engine.save_checkpoint(obj[0], tag="half", client_state={"step": step, "seen": step * micro})
        losses.append(train_step(step))
    _, client_state = engine.load_checkpoint(obj[0], tag="half")
    replayed = [train_step(s) for s in range(client_state["step"], client_state["step"] + 2)]
    if rank == 0:
        print("RESULT " + json.dumps({"losses": losses, "replayed": replayed, "client_state": client_state,
                                      "lr": engine.get_lr()}), flush=True)


if __name__ == "__main__":
    main()
