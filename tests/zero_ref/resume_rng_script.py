"""A DeepSpeed-style script that resumes with dropout on: what does it draw after ``load_checkpoint``?

    torchrun --nproc_per_node=2 tests/zero_ref/resume_rng_script.py --engine zero_ref|deepspeed CKPT_DIR

Four steps with a checkpoint after the second; then the script reseeds (``7 + rank``), loads the
checkpoint, draws ``torch.rand(3)`` and trains the last two steps again. Rank 0 prints ``RESULT {json}``:
every rank's draws, the losses of the four steps and of the two resumed ones.
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": 1}, "steps_per_print": 100}


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(2, 8, generator=g)
    return x, (x[:, 0] > 0).long()


def engine_and_steps(deepspeed, rank: int):
    """An engine over a dropout model (seeded per rank: the engine broadcasts rank 0's weights), and a
    function that trains n steps from the engine's global step and returns their losses."""
    torch.manual_seed(1337 + rank)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 2))
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=CONFIG)

    def steps(n: int) -> list:
        losses = []
        for _ in range(n):
            x, y = batch(engine.global_steps, rank)
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses

    return engine, steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=("zero_ref", "deepspeed"), default="zero_ref")
    parser.add_argument("ckpt")
    args = parser.parse_args()
    if args.engine == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
    else:
        import zero_ref.ds as deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    engine, steps = engine_and_steps(deepspeed, rank)
    losses = steps(2)
    engine.save_checkpoint(args.ckpt, tag="two")
    losses += steps(2)
    torch.manual_seed(7 + rank)
    engine.load_checkpoint(args.ckpt, tag="two")
    mine = {"draws": torch.rand(3).tolist(), "losses": losses, "resumed": steps(2)}
    every = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every, mine)
    if rank == 0:
        print("RESULT " + json.dumps({k: [r[k] for r in every] for k in mine}), flush=True)


if __name__ == "__main__":
    main()
