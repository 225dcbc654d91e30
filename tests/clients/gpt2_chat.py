"""DeepSpeed-Chat's step1 main.py shape on synthetic tokens: a tiny GPT-2 built from its config under
``HfDeepSpeedConfig`` (ZeRO-3 construction), weight-decay param groups by name (``get_optimizer_grouped_parameters``),
``deepspeed.ops.adam.FusedAdam``, a transformers scheduler (``get_scheduler``) handed to ``initialize``, a
DistributedSampler loader, ``model.backward`` / ``model.step``, and a perplexity all-reduced over the ranks.

Rank 0 prints ``RESULT {"engine": ..., "losses": [...], "lr": [...], "perplexity": [before, after]}``.
"""
import argparse
import json
import math

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from transformers import AutoModelForCausalLM, GPT2Config, get_scheduler
from transformers.integrations import HfDeepSpeedConfig

import deepspeed
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam


def parse_args():
    parser = argparse.ArgumentParser(description="Finetune a causal language modelling task")
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--weight_decay", type=float, default=0.1)
    parser.add_argument("--num_train_epochs", type=int, default=1)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--lr_scheduler_type", type=str, default="cosine")
    parser.add_argument("--num_warmup_steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--offload", action="store_true")
    parser.add_argument("--dtype", type=str, default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--zero_stage", type=int, default=3)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def get_train_ds_config(offload, dtype, stage):
    device = "cpu" if offload else "none"
    return {"steps_per_print": 1000,
            "zero_optimization": {"stage": stage, "offload_param": {"device": device},
                                  "offload_optimizer": {"device": device},
                                  "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 3e7,
                                  "stage3_prefetch_bucket_size": 3e7, "memory_efficient_linear": False},
            "bf16": {"enabled": dtype == "bf16"},
            "gradient_clipping": 1.0,
            "prescale_gradients": False,
            "wall_clock_breakdown": False}


def get_optimizer_grouped_parameters(model, weight_decay,
                                     no_decay_name_list=("bias", "layer_norm.weight", "layernorm.weight",
                                                         "norm.weight", "ln_f.weight", "ln_1.weight", "ln_2.weight")):
    groups = [{"params": [p for n, p in model.named_parameters()
                          if not any(nd in n.lower() for nd in no_decay_name_list) and p.requires_grad],
               "weight_decay": weight_decay},
              {"params": [p for n, p in model.named_parameters()
                          if any(nd in n.lower() for nd in no_decay_name_list) and p.requires_grad],
               "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def get_all_reduce_mean(tensor):
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor / torch.distributed.get_world_size()


def synthetic_dataset(n: int, seq: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    ids = (start + torch.arange(seq) * 3) % vocab  # arithmetic sequences: learnable
    return TensorDataset(ids)


def main():
    args = parse_args()
    get_accelerator().set_device(max(args.local_rank, 0))
    device = torch.device(get_accelerator().device_name())
    deepspeed.init_distributed()
    args.global_rank = torch.distributed.get_rank()
    ds_config = get_train_ds_config(args.offload, args.dtype, args.zero_stage)
    ds_config["train_micro_batch_size_per_gpu"] = args.per_device_train_batch_size
    ds_config["train_batch_size"] = (args.per_device_train_batch_size * torch.distributed.get_world_size()
                                     * args.gradient_accumulation_steps)
    torch.manual_seed(args.seed)
    torch.distributed.barrier()

    dschf = HfDeepSpeedConfig(ds_config) if args.zero_stage == 3 else None  # noqa: F841 (kept alive for from_config)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(config)

    train_dataset, eval_dataset = synthetic_dataset(64, 16, 64, 0), synthetic_dataset(16, 16, 64, 1)
    collate = lambda rows: {"input_ids": torch.stack([r[0] for r in rows]),  # noqa: E731
                            "labels": torch.stack([r[0] for r in rows])}
    train_dataloader = DataLoader(train_dataset, collate_fn=collate, sampler=DistributedSampler(train_dataset),
                                  batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(eval_dataset, collate_fn=collate, sampler=DistributedSampler(eval_dataset),
                                 batch_size=args.per_device_train_batch_size)

    def evaluation(model, eval_dataloader):
        model.eval()
        losses = 0
        for step, batch in enumerate(eval_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                losses += model(**batch).loss.float()
        losses = get_all_reduce_mean(losses / (step + 1))
        return torch.exp(losses).item()

    optimizer_grouped_parameters = get_optimizer_grouped_parameters(model, args.weight_decay)
    AdamOptimizer = DeepSpeedCPUAdam if args.offload else FusedAdam
    optimizer = AdamOptimizer(optimizer_grouped_parameters, lr=args.learning_rate, betas=(0.9, 0.95))
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps,
                                 num_training_steps=args.num_train_epochs * num_update_steps_per_epoch)
    model, optimizer, _, lr_scheduler = deepspeed.initialize(model=model, optimizer=optimizer, args=args,
                                                             config=ds_config, lr_scheduler=lr_scheduler,
                                                             dist_init_required=True)
    perplexity = [evaluation(model, eval_dataloader)]
    losses, lrs = [], []
    for epoch in range(args.num_train_epochs):
        train_dataloader.sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch, use_cache=False).loss
            model.backward(loss)
            model.step()
            losses.append(loss.item())
            lrs.append(lr_scheduler.get_last_lr()[0])
    perplexity.append(evaluation(model, eval_dataloader))
    if args.global_rank == 0:
        print("RESULT " + json.dumps({"engine": type(model).__module__, "losses": losses, "lr": lrs,
                                      "perplexity": perplexity}), flush=True)


if __name__ == "__main__":
    main()
