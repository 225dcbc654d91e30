"""HelloDeepSpeed's train_bert_ds.py shape on synthetic tokens: a small RoBERTa masked-LM (transformers, from a
config, dropout on) trained at ZeRO-3 in bf16 with ``loss.backward()`` and ``model.step()``, the config built in
the script, a checkpoint every ``--checkpoint_every`` steps with ``client_state={"checkpoint_step": step}``, and
``--load_checkpoint_dir`` to resume from it in a fresh run.

Rank 0 prints ``RESULT {"engine": ..., "steps": [...], "losses": [...]}``: the steps this run trained and their losses.
"""
import argparse
import json
import os

import torch
from transformers import RobertaConfig, RobertaForMaskedLM

import deepspeed

VOCAB, SEQ, MASK_ID = 96, 16, 3


def is_rank_0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def get_args():
    parser = argparse.ArgumentParser(description="masked LM")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--checkpoint_dir", type=str, default=None)
    parser.add_argument("--load_checkpoint_dir", type=str, default=None)
    parser.add_argument("--checkpoint_every", type=int, default=4)
    parser.add_argument("--num_iterations", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--dtype", type=str, default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--zero", type=int, default=3)
    return parser.parse_args()


def batch_at(step: int, batch_size: int, rank: int):
    """The step's batch: 15% of the tokens masked, the labels -100 elsewhere (the data is fixed by the step)."""
    g = torch.Generator().manual_seed(step * 100 + rank)
    tokens = torch.randint(4, VOCAB, (batch_size, SEQ), generator=g)
    tokens[:, 1::2] = (tokens[:, ::2] + 7) % VOCAB  # something to learn
    masked = torch.rand(batch_size, SEQ, generator=g) < 0.15
    masked[:, 1] = True
    labels = torch.where(masked, tokens, torch.full_like(tokens, -100))
    return {"input_ids": torch.where(masked, torch.full_like(tokens, MASK_ID), tokens),
            "attention_mask": torch.ones_like(tokens), "labels": labels}


def create_model() -> RobertaForMaskedLM:
    config = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=SEQ + 4, hidden_dropout_prob=0.1,
                           attention_probs_dropout_prob=0.1, pad_token_id=1)
    return RobertaForMaskedLM(config)


def train(args):
    deepspeed.init_distributed()
    torch.manual_seed(2024)
    model = create_model()
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        args.dtype: {"enabled": True},
        "zero_optimization": {"stage": args.zero},
        "steps_per_print": 1000,
    }
    model, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    start_step = 1
    if args.load_checkpoint_dir is not None:
        _, client_state = model.load_checkpoint(load_dir=args.load_checkpoint_dir)
        start_step = client_state["checkpoint_step"] + 1
    model.train()
    steps, losses = [], []
    rank = torch.distributed.get_rank()
    for step in range(start_step, args.num_iterations):
        batch = {k: v.to(model.device) for k, v in batch_at(step, args.batch_size, rank).items()}
        loss = model(**batch).loss
        loss.backward()  # not model.backward: the engine's step still reduces and divides as DeepSpeed's does
        model.step()
        steps.append(step)
        losses.append(loss.item())
        if args.checkpoint_dir is not None and step % args.checkpoint_every == 0:
            model.save_checkpoint(save_dir=args.checkpoint_dir, client_state={"checkpoint_step": step})
    if is_rank_0():
        print("RESULT " + json.dumps({"engine": type(model).__module__, "steps": steps, "losses": losses}), flush=True)


if __name__ == "__main__":
    train(get_args())
