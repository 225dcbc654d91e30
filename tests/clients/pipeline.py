"""pipeline_parallelism/train.py's shape on synthetic data: ``-p 2`` builds a ``PipelineModule`` from a layer list
(a lambda among them), ``deepspeed.runtime.utils.set_random_seed``, ``training_data`` handed to ``initialize``
and ``engine.train_batch()`` drawing from the engine's own loader; ``-p 0`` trains the same layers as one module
with ``engine(x)`` / ``backward`` / ``step`` (the example's ``train_base``).

Rank 0 prints ``RESULT {"engine": ..., "losses": [...]}``: the loss of each step (with ``-p 0``, of its last
micro-batch).
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn

import deepspeed
from deepspeed.pipe import PipelineModule
from deepspeed.utils import RepeatingLoader


def get_args():
    parser = argparse.ArgumentParser(description="synthetic pipeline")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("-s", "--steps", type=int, default=8, help="quit after this many steps")
    parser.add_argument("-p", "--pipeline-parallel-size", type=int, default=2, help="pipeline parallelism")
    parser.add_argument("--backend", type=str, default="gloo", help="distributed backend")
    parser.add_argument("--seed", type=int, default=1138, help="PRNG seed")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def trainset():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 16, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, :4].sum(1) > 0).long() + (x[:, 4] > 0.5).long())


def layers():
    return [nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 48), nn.Tanh(), lambda x: x * 0.5, nn.Linear(48, 48),
            nn.ReLU(), nn.Linear(48, 3)]


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def train_base(args):
    torch.manual_seed(args.seed)
    net = nn.Sequential(*[m if isinstance(m, nn.Module) else Lambda(m) for m in layers()])
    engine, _, dataloader, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=trainset())
    data_iter = iter(RepeatingLoader(dataloader))
    criterion = torch.nn.CrossEntropyLoss()
    losses = []
    for micro_step in range(args.steps * engine.gradient_accumulation_steps()):
        inputs, labels = next(data_iter)
        loss = criterion(engine(inputs.to(engine.device)), labels.to(engine.device))
        engine.backward(loss)
        engine.step()
        if (micro_step + 1) % engine.gradient_accumulation_steps() == 0:
            losses.append(loss.item())
    return engine, losses


def train_pipe(args, part="parameters"):
    torch.manual_seed(args.seed)
    deepspeed.runtime.utils.set_random_seed(args.seed)
    net = PipelineModule(layers=layers(), loss_fn=torch.nn.CrossEntropyLoss(), num_stages=args.pipeline_parallel_size,
                         partition_method=part, activation_checkpoint_interval=0)
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=trainset())
    return engine, [engine.train_batch().item() for _ in range(args.steps)]


if __name__ == "__main__":
    args = get_args()
    deepspeed.init_distributed(dist_backend=args.backend)
    args.local_rank = int(os.environ["LOCAL_RANK"])
    engine, losses = train_base(args) if args.pipeline_parallel_size == 0 else train_pipe(args)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"engine": type(engine).__module__, "losses": losses}), flush=True)
