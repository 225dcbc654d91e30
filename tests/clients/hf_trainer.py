"""A HuggingFace Trainer script with a DeepSpeed config, as a Trainer user writes one.

    torchrun --nproc_per_node=2 tests/clients/hf_trainer.py --stage 3 --out losses.json          # DeepSpeed
    torchrun --nproc_per_node=2 -m zero_ref.ds.run tests/clients/hf_trainer.py --stage 3 ...     # zero_ref
    zero-ref --num_gpus 2 tests/clients/hf_trainer.py --stage 3 ...                              # zero_ref

There is no ``import deepspeed``: transformers and accelerate import it. A tiny GPT-2 is built from its
config (or loaded with ``from_pretrained`` from ``--model_name_or_path``, a local folder) after the
``TrainingArguments``, so at ZeRO-3 it is built inside ``deepspeed.zero.Init``. The data are synthetic.
On a machine without a GPU accelerate finds no backend by itself (``PartialState._prepare_backend``),
so the script builds its state with ``backend="gloo"`` in DeepSpeed mode (joined through
``deepspeed.comm``) and the Trainer reuses it
(``use_configured_state``); ``ddp_backend`` is not read when ``deepspeed=`` is given. Rank 0 writes the
logged losses to ``--out`` as JSON.
"""
import argparse
import json
import os

import torch
import transformers

SEQ, VOCAB = 16, 64


def gpt2_config() -> transformers.GPT2Config:
    return transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def ds_config(stage: int, gather_16bit: bool = False) -> dict:
    return {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto", "torch_adam": True}},
        "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": gather_16bit},
        "steps_per_print": 1000,
    }


def dataset(rows: int) -> list[dict]:
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, VOCAB, (rows, SEQ), generator=g)
    return [{"input_ids": r, "labels": r} for r in ids]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--grad_accum", type=int, default=2)
    p.add_argument("--model_name_or_path", default=None, help="a local folder saved with save_pretrained")
    p.add_argument("--output_dir", default="hf_trainer_out")
    p.add_argument("--save_steps", type=int, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--gather_16bit", action="store_true", help="ZeRO-3 checkpoints hold the gathered weights too")
    p.add_argument("--out", default=None, help="rank 0 writes the logged losses here (JSON)")
    p.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    a = p.parse_args()

    cpu_only = not torch.cuda.is_available()
    if cpu_only:
        from accelerate import PartialState

        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # accelerate then joins through deepspeed.comm
        PartialState(backend="gloo")
        del os.environ["ACCELERATE_USE_DEEPSPEED"]

    args = transformers.TrainingArguments(
        output_dir=a.output_dir, per_device_train_batch_size=2, gradient_accumulation_steps=a.grad_accum,
        max_steps=a.steps, learning_rate=1e-2, weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0,
        lr_scheduler_type="linear", warmup_steps=2, logging_steps=1, seed=0, report_to=[], disable_tqdm=True,
        save_strategy="steps" if a.save_steps else "no", save_steps=a.save_steps or 500,
        accelerator_config={"use_configured_state": cpu_only}, deepspeed=ds_config(a.stage, a.gather_16bit))
    torch.manual_seed(0)
    if a.model_name_or_path:
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model_name_or_path)
    else:
        model = transformers.AutoModelForCausalLM.from_config(gpt2_config())
    rows = 2 * args.world_size * a.grad_accum * a.steps
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset(rows))
    trainer.train()
    if a.out and args.process_index == 0:
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        with open(a.out, "w") as f:
            json.dump({"losses": losses, "engine": type(trainer.model_wrapped).__module__ + "."
                       + type(trainer.model_wrapped).__name__, "world_size": args.world_size}, f)


if __name__ == "__main__":
    main()
