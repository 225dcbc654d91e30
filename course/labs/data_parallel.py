"""Lab: data-parallel training by hand, launched with torchrun — the baseline ZeRO improves on.

    torchrun --nproc_per_node=2 -m course.labs.data_parallel --steps 3

Every rank builds the same GPT (same seed), takes its own slice of the global batch, and
all-reduces the gradients through zero_ref.comm, which counts the bytes. Rank 0 also trains a
single-process copy on the whole global batch and checks that both end with the same weights.
Runs on CPU (gloo) or, when CUDA is available, on one GPU per rank (NCCL).
"""
import argparse
import os

import torch
import torch.distributed as dist

from zero_ref import comm
from zero_ref.models import GPT, GPTConfig, make_batch


def train(model, batches, steps, lr, world_size=1):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        idx, targets = batches(step)
        _, loss = model(idx, targets)
        loss.backward()
        if world_size > 1:  # average the gradients of all ranks: the data-parallel step
            for p in model.parameters():
                comm.all_reduce(p.grad, op="avg")
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} must divide by the number of ranks ({world})")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    cfg = GPTConfig(n_layers=2, d_model=128, bias=False)  # no key bias: its true gradient is 0, so Adam would amplify rounding noise
    per_rank = args.global_batch // world

    def global_batch(step):
        return make_batch(cfg, args.global_batch, seed=step, device=device)

    def my_slice(step):
        idx, targets = global_batch(step)
        return idx[rank * per_rank:(rank + 1) * per_rank], targets[rank * per_rank:(rank + 1) * per_rank]

    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    with comm.recording() as log:
        losses = train(model, my_slice, args.steps, args.lr, world)
    psi = sum(p.numel() for p in model.parameters())
    expected = 4 * psi * args.steps  # fp32 gradients, one all-reduce of every gradient per step

    # Everyone's weights → rank 0, compared with a single-process run on the whole global batch.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = torch.empty(world * flat.numel(), device=device)
    comm.all_gather(gathered, flat)
    if rank == 0:
        torch.manual_seed(0)
        ref = GPT(cfg).to(device)
        train(ref, global_batch, args.steps, args.lr)
        ref_flat = torch.cat([p.detach().flatten() for p in ref.parameters()])
        diff = max((g - ref_flat).abs().max().item() for g in gathered.view(world, -1))
        print(f"ranks={world} params={psi} steps={args.steps} losses={[round(x, 4) for x in losses]}")
        print(f"all-reduce bytes per rank: {log.total_bytes()} (theory 4*params*steps = {expected})")
        print(f"ring wire bytes per rank: {log.total_wire_bytes():.0f} (theory {2 * (world - 1) / world * expected:.0f})")
        print(f"max |weights - single-process weights| = {diff:.2e}")
        ok = log.total_bytes() == expected and diff < 1e-5
        print("OK" if ok else "MISMATCH")
    dist.barrier()  # leave together: gloo torn down on one rank while another still works can abort it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
