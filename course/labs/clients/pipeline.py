"""A DeepSpeedExamples-style pipeline script (pipeline_parallelism's shape), on synthetic data.

    torchrun --nproc_per_node=2 -m course.labs.clients.pipeline --engine zero_ref --deepspeed_config ds.json

A ``PipelineModule`` of ``LayerSpec``s cut into 2 stages by parameter count, a loss function,
``deepspeed.initialize`` with ``model_parameters``, and ``engine.train_batch(data_iter=...)`` over a
``RepeatingLoader`` of a DataLoader. ``--engine`` picks the import line. Rank 0 prints
``RESULT {json}`` with the loss of every step (every stage gets the same loss back).
"""
import argparse
import json
import os

import torch
import torch.nn as nn


def get_args():
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--engine", choices=("zero_ref", "deepspeed"), default="zero_ref")
    engine, _ = pre.parse_known_args()
    if engine.engine == "deepspeed":
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        from deepspeed.pipe import LayerSpec, PipelineModule
        from deepspeed.utils import RepeatingLoader
    else:
        import zero_ref.ds as deepspeed  # the import lines are all that differ
        from zero_ref.ds.pipe import LayerSpec, PipelineModule
        from zero_ref.ds.utils import RepeatingLoader
    parser = argparse.ArgumentParser(description="pipeline", parents=[pre])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pipeline-parallel-size", type=int, default=2)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    return deepspeed, LayerSpec, PipelineModule, RepeatingLoader, parser.parse_args()


def main():
    deepspeed, LayerSpec, PipelineModule, RepeatingLoader, args = get_args()
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else None)
    torch.manual_seed(0)
    layers = [LayerSpec(nn.Linear, 10, 32), nn.ReLU(), LayerSpec(nn.Linear, 32, 32), nn.ReLU(),
              LayerSpec(nn.Linear, 32, 3)]
    net = PipelineModule(layers=layers, loss_fn=nn.CrossEntropyLoss(), num_stages=args.pipeline_parallel_size,
                         partition_method="parameters")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 10, generator=g)
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())
    engine, _, _, _ = deepspeed.initialize(args=args, model=net,
                                           model_parameters=[p for p in net.parameters() if p.requires_grad])
    loader = torch.utils.data.DataLoader(data, batch_size=engine.train_micro_batch_size_per_gpu(), shuffle=False)
    it = RepeatingLoader(loader)
    losses = [engine.train_batch(data_iter=it).item() for _ in range(args.steps)]
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps({"losses": losses}), flush=True)


if __name__ == "__main__":
    main()
