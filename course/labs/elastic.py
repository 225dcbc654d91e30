"""Lab: fault-tolerant training — checkpoint every few steps, resume from the latest one on (re)start.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 2 --max-restarts 1 \\
        -m course.labs.elastic --checkpoint-dir ckpt --steps 8 --save-every 2 --kill-at-step 5

Every start (the first, and each restart torchrun makes after a worker died) loads ``latest`` from
``--checkpoint-dir`` if there is one, and trains on to ``--steps``, saving every ``--save-every`` steps.
The data of step s is drawn from seed s, so a resumed run sees exactly the batches it would have seen.
``--kill-at-step K`` makes rank ``--kill-rank`` SIGKILL itself once, right after step K (before that
step's checkpoint) or, with ``--kill-during-save``, half-way through writing its shard of checkpoint K
(a node lost mid-save: the checkpoint is never committed, ``latest`` stays on the one before).
torchrun's agent sees the dead worker, stops the others and starts them all again,
and the new workers resume from the last checkpoint, recomputing the steps that were lost (the
environment variable works around a torch 2.13 bug: see ``check_restartable``). A marker file
records the kill so the restarted run does not kill itself again. At the end the final weights are saved
(tag ``final``) and rank 0 prints their SHA-256: the same digest as a run that was never interrupted.

Across machines, one torchrun per node with a c10d rendezvous (here two "nodes" on one machine):

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 \\
        --rdzv-id lab -m course.labs.elastic --checkpoint-dir ckpt      # run it twice, once per node

The checkpoint directory must be one both nodes see (a shared file system), as with DeepSpeed.
"""
import argparse
import hashlib
import os
import re
import signal
import sys

import torch

from zero_ref import initialize
from zero_ref.checkpoint import sharded
from zero_ref.checkpoint.format import get_fp32_state_dict_from_zero_checkpoint
from zero_ref.models import GPT, GPTConfig, make_batch

CFG = GPTConfig(vocab_size=97, seq_len=8, d_model=21, n_heads=3, n_layers=2)


def digest(state: dict) -> str:
    """SHA-256 of the tensors' bytes in key order: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].contiguous().numpy().tobytes())
    return h.hexdigest()


def check_restartable() -> None:
    """Refuse up front a run whose restarts could not reconnect, instead of failing at the first restart.

    torch 2.13's torchrun shares its rendezvous TCPStore with the workers by default; a restarted worker
    then reads its peers' gloo addresses left there by the previous attempt and cannot connect
    (pytorch/pytorch#135712). TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives every attempt a fresh store;
    the static rendezvous (torchrun without --standalone or --rdzv-backend) always shares it."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise SystemExit("--max-restarts needs a fresh rendezvous store per attempt: run torchrun with --standalone "
                         "(one node) or --rdzv-backend c10d, and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its "
                         "environment (see course/labs/elastic.py)")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--stage", type=int, default=2, choices=(0, 1, 2, 3))
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--kill-at-step", type=int, default=None, help="kill one rank once, right after this step")
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--kill-during-save", action="store_true", help="die while writing checkpoint K instead")
    args = ap.parse_args(argv)
    if args.kill_during_save and (args.kill_at_step is None or args.kill_at_step % args.save_every):
        ap.error("--kill-during-save needs a --kill-at-step that is a multiple of --save-every (a step that saves)")
    return args


def die_while_saving(attempt: int, rank: int) -> None:
    """Fault injection: the next file this rank writes gets its first bytes, then the process is killed."""
    def half_then_die(obj, path):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04" + bytes(60))  # the start of a zip archive, and no more
        print(f"attempt {attempt}: rank {rank} is killed (SIGKILL) while writing {os.path.basename(path)}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    sharded._save_file = half_then_die  # the one function that writes a checkpoint file


def train(argv=None) -> str | None:
    """Resume from the latest checkpoint (if any), train to --steps, save; rank 0 returns the weights' digest.
    Needs a joined process group (torchrun's, or zero_ref.launch's); the engine joins torchrun's."""
    args = parse_args(argv)
    check_restartable()
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    torch.manual_seed(0)
    model = GPT(CFG)
    config = {"train_batch_size": args.global_batch, "gradient_clipping": 0.0, "steps_per_print": 10**6,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-6, "weight_decay": 0.1}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": args.steps, "warmup_type": "linear"}},
              "zero_optimization": {"stage": args.stage}}
    engine, *_ = initialize(model=model, config=config)  # joins the process group torchrun describes
    rank, world = engine.dp_rank, engine.dp_world_size

    def say(msg):
        if rank == 0:
            print(f"attempt {attempt}: {msg}", flush=True)

    if rank == 0 and os.path.isdir(args.checkpoint_dir):
        for name in sorted(os.listdir(args.checkpoint_dir)):
            if ".tmp-" in name:  # (the next save removes it)
                say(f"found an unfinished save, {re.sub(r'-[0-9a-f]+$', '-<nonce>', name)}")
    path, client = engine.load_checkpoint(args.checkpoint_dir)
    say(f"{world} ranks, resumed from {os.path.basename(path)} at step {engine.global_steps}" if path else
        f"{world} ranks, no checkpoint: starting at step 0")
    marker = os.path.join(args.checkpoint_dir, f"killed_at_step{args.kill_at_step}")
    micro = args.global_batch // world
    while engine.global_steps < args.steps:
        idx, targets = make_batch(CFG, args.global_batch, seed=engine.global_steps)
        _, loss = engine(idx[rank * micro:(rank + 1) * micro], targets[rank * micro:(rank + 1) * micro])
        engine.backward(loss)
        engine.step()
        step = engine.global_steps
        if step == args.kill_at_step and rank == args.kill_rank and not os.path.exists(marker):
            open(marker, "w").close()
            if args.kill_during_save:
                die_while_saving(attempt, rank)
            else:
                print(f"attempt {attempt}: rank {rank} kills itself (SIGKILL) after step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        if step % args.save_every == 0 or step == args.steps:
            engine.save_checkpoint(args.checkpoint_dir, client_state={"loss": loss.item()})
            say(f"step {step}: saved {os.path.join(os.path.basename(args.checkpoint_dir), f'global_step{step}')}")
    engine.save_checkpoint(args.checkpoint_dir, tag="final", save_latest=False)
    if rank == 0:
        sha = digest(get_fp32_state_dict_from_zero_checkpoint(args.checkpoint_dir, tag="final"))[:16]
        say(f"done at step {engine.global_steps}; weights sha256 {sha}")
        return sha
    return None


def main(argv=None):
    train(argv)
    # torch 2.13's gloo sometimes aborts in its teardown (SIGABRT, "terminate called without an active
    # exception") after all the work is done, and torchrun would count that as a failed worker: once every
    # rank is past the last collective, leave without the teardown.
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
