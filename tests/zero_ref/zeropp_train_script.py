"""A DeepSpeed training script in DeepSpeedExamples' shape (argparse + add_config_arguments, the model built inside
zero.Init with the config, initialize, backward, step), with nothing of zero_ref: the ZeRO++ keys come from the
config. It prints one line, RESULT {"losses": [...]}, from rank 0.

    torchrun --nproc_per_node=4 -m zero_ref.ds.run tests/zero_ref/zeropp_train_script.py --deepspeed_config ds.json
"""
import argparse
import json

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN, STEPS = 96, 40, 4


class FrozenTable(nn.Module):
    """A fixed embedding table: its weight is frozen in its own constructor, so zero.Init partitions it frozen."""

    def __init__(self, rows, width):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, width), requires_grad=False)

    def forward(self, tokens):
        return F.embedding(tokens, self.weight)


class TinyLM(nn.Module):
    """A frozen embedding table, then three trainable layers of distinct sizes (each gather's size names its
    layer)."""

    def __init__(self):
        super().__init__()
        self.embed = FrozenTable(VOCAB, HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.mid = nn.Linear(2 * HIDDEN, 3 * HIDDEN)
        self.head = nn.Linear(3 * HIDDEN, VOCAB)

    def forward(self, tokens, targets):
        x = torch.relu(self.up(self.embed(tokens)))
        return F.cross_entropy(self.head(torch.tanh(self.mid(x))), targets)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed()
    with open(args.deepspeed_config) as f:
        stage = json.load(f)["zero_optimization"]["stage"]
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=args.deepspeed_config, enabled=stage == 3):
        model = TinyLM()
    engine, *_ = deepspeed.initialize(args=args, model=model,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    batch = engine.train_micro_batch_size_per_gpu()
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 + step)  # one global batch per step; each rank takes its slice
        tokens = torch.randint(0, VOCAB, (world * batch,), generator=g)
        targets = (3 * tokens + 1) % VOCAB
        mine = slice(rank * batch, (rank + 1) * batch)
        loss = engine(tokens[mine], targets[mine])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if rank == 0:
        print("RESULT " + json.dumps({"losses": losses}), flush=True)


if __name__ == "__main__":
    main()
