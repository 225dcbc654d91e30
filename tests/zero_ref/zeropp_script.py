"""A DeepSpeed script with ZeRO++ keys, for both engines:

    torchrun --nproc_per_node=4 tests/zero_ref/zeropp_script.py --engine zero_ref|deepspeed KEY=JSON ...

ZeRO-3 in fp32, every parameter partitioned and re-gathered in backward (so hpZ's secondary copy is used),
three AdamW steps on per-rank batches. Rank 0 prints ``RESULT {json}``: the losses and the final weights.
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=("zero_ref", "deepspeed"), default="zero_ref")
    parser.add_argument("keys", nargs="*", help="zero_optimization KEY=JSON")
    args = parser.parse_args()
    if args.engine == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
    else:
        import zero_ref.ds as deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
            "stage3_prefetch_bucket_size": 0}
    zero.update({k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.keys)})
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
              "zero_optimization": zero, "steps_per_print": 100}
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    losses = []
    for step in range(3):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 16, generator=g)
        loss = F.cross_entropy(engine(x), (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long())
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        weights = {n: p.detach().reshape(-1).tolist() for n, p in engine.module.named_parameters()}
    every = [None] * world
    torch.distributed.all_gather_object(every, losses)
    if rank == 0:
        print("RESULT " + json.dumps({"losses": every, "weights": weights}), flush=True)


if __name__ == "__main__":
    main()
