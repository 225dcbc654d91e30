"""nanoGPT's train.py loop on DeepSpeed, on synthetic tokens: ``configure_optimizers``' two groups (weight decay on
matrices, none on biases and norms) in a client ``torch.optim.AdamW``, the learning rate set by hand in
``optimizer.param_groups`` every iteration (warm-up then cosine), batches drawn with ``torch.randint`` from a
per-rank seed, ``estimate_loss`` every ``--eval_interval``, a checkpoint there with nanoGPT's bookkeeping as
``client_state``, and ``--init_from resume`` to continue from it in a fresh run.

Rank 0 prints ``RESULT {"engine": ..., "iters": [...], "losses": [...], "lr": [...], "val": {...}}``.
"""
import argparse
import json
import math
import os

import torch
import torch.nn as nn
from torch.nn import functional as F

import deepspeed

block_size, vocab_size, n_embd, n_head = 16, 48, 32, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block() for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)) if targets is not None else None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [{"params": decay_params, "weight_decay": weight_decay},
                        {"params": nodecay_params, "weight_decay": 0.0}]
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)


def get_args():
    parser = argparse.ArgumentParser(description="nanoGPT on DeepSpeed")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out_dir", type=str, required=True)
    parser.add_argument("--init_from", type=str, default="scratch", choices=("scratch", "resume"))
    parser.add_argument("--max_iters", type=int, default=6)
    parser.add_argument("--eval_interval", type=int, default=4)
    parser.add_argument("--eval_iters", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=6e-3)
    parser.add_argument("--warmup_iters", type=int, default=2)
    parser.add_argument("--min_lr", type=float, default=6e-4)
    parser.add_argument("--zero_stage", type=int, default=2)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = get_args()
    deepspeed.init_distributed()
    ddp_rank = int(os.environ["RANK"])
    master_process = ddp_rank == 0
    torch.manual_seed(1337 + ddp_rank)  # seed_offset = ddp_rank, as nanoGPT
    batch_size, gradient_accumulation_steps = 4, 2
    g = torch.Generator().manual_seed(0)
    data = {"train": torch.randint(vocab_size, (2048,), generator=g),
            "val": torch.randint(vocab_size, (512,), generator=g)}
    data["train"][1::3] = (data["train"][0::3][:len(data["train"][1::3])] * 5) % vocab_size  # learnable pairs

    def get_batch(split):
        d = data[split]
        ix = torch.randint(len(d) - block_size, (batch_size,))
        x = torch.stack([d[i:i + block_size] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    def get_lr(it):  # linear warm-up, then cosine down to min_lr
        if it < args.warmup_iters:
            return args.learning_rate * (it + 1) / (args.warmup_iters + 1)
        ratio = (it - args.warmup_iters) / (args.max_iters - args.warmup_iters)
        return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.learning_rate - args.min_lr)

    model = GPT()
    optimizer = model.configure_optimizers(0.1, args.learning_rate, (0.9, 0.95))
    ds_config = {"train_micro_batch_size_per_gpu": batch_size,
                 "gradient_accumulation_steps": gradient_accumulation_steps, "gradient_clipping": 1.0,
                 "zero_optimization": {"stage": args.zero_stage}, "steps_per_print": 1000}
    model, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    iter_num, best_val_loss = 0, 1e9
    if args.init_from == "resume":
        _, client_state = model.load_checkpoint(args.out_dir)
        iter_num, best_val_loss = client_state["iter_num"], client_state["best_val_loss"]

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(args.eval_iters)
            for k in range(args.eval_iters):
                X, Y = get_batch(split)
                losses[k] = model(X, Y)[1].item()
            out[split] = losses.mean().item()
        model.train()
        return out

    iters, losses, lrs, val = [], [], [], {}
    while True:
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num % args.eval_interval == 0:
            est = estimate_loss()
            val[iter_num] = est["val"]
            if est["val"] < best_val_loss or iter_num > 0:
                best_val_loss = min(best_val_loss, est["val"])
                if iter_num > 0:
                    model.save_checkpoint(args.out_dir, client_state={"iter_num": iter_num,
                                                                      "best_val_loss": best_val_loss})
        total = 0.0
        for micro_step in range(gradient_accumulation_steps):
            X, Y = get_batch("train")
            _, loss = model(X, Y)
            model.backward(loss)
            model.step()
            total += loss.item() / gradient_accumulation_steps
        iters.append(iter_num)
        losses.append(total)
        lrs.append(lr)
        iter_num += 1
        if iter_num > args.max_iters:
            break
    if master_process:
        print("RESULT " + json.dumps({"engine": type(model).__module__, "iters": iters, "losses": losses, "lr": lrs,
                                      "val": val, "best_val_loss": best_val_loss}), flush=True)


if __name__ == "__main__":
    main()
