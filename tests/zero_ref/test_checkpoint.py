"""Sharded checkpoints on real gloo ranks: a resumed run is bit-identical to an uninterrupted one at every
stage; a checkpoint loads at another DP size (and stage); consolidation equals the fp32 master weights;
a crash mid-save leaves the previous checkpoint; a malicious pickle is refused without running."""
import json
import os
import pickle
import signal
import subprocess
import sys
import pytest
import torch

import zero_ref
from zero_ref import checkpoint, comm
from zero_ref import initialize
from zero_ref.checkpoint import CheckpointError, Reader, sharded
from zero_ref.checkpoint.format import get_fp32_state_dict_from_zero_checkpoint
from zero_ref.models import make_batch
from tests.zero_ref.cases import ADAM, CFG, build_model

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # real multi-rank jobs
GLOBAL_BATCH = 12  # divides by 1, 2, 3 and 4 ranks: every DP size trains on the same global batches
K = 3              # steps before the checkpoint, and after it


# name -> (zero stage, config additions); fp32 unless named
CASES = {
    "stage0": (0, {}), "stage1": (1, {}), "stage2": (2, {}), "stage3": (3, {}),
    "stage2_fp16": (2, {"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 2}}),  # + scaler
    "stage1_dropout": (1, {}),                          # each rank's random stream too (load_rng_state=True)
    "stage3_bf16": (3, {"bf16": {"enabled": True}}),    # fp32 masters apart from the 16-bit partitions
    "stage1_offload": (1, {"offload_optimizer": {"device": "cpu"}}),
    "stage3_nvme": (3, {"offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"}}),  # Infinity
    "stage3_groups": (3, {}),                           # model_parameters: two groups with their own values
}


def groups(model):
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if p.dim() >= 2]},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0, "betas": (0.8, 0.99)}]


def config(case, world, stage=None, nvme_dir=None):
    s, extra = CASES[case]
    zero = {"stage": s if stage is None else stage, "reduce_bucket_size": 3000,
            "stage3_param_persistence_threshold": 50}  # LayerNorm units stay gathered: reloaded and re-gathered
    for sec in ("offload_optimizer", "offload_param"):
        if sec in extra and zero["stage"] == s:
            zero[sec] = {**extra[sec], **({"nvme_path": nvme_dir} if extra[sec]["device"] == "nvme" else {})}
    return {"train_batch_size": GLOBAL_BATCH, "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
            "gradient_clipping": 0.0, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": ADAM.lr, "eps": ADAM.eps, "weight_decay": ADAM.weight_decay}},
            # the rate still rises at the checkpoint (step 3 of 5): the schedule's place and the rate it wrote are state
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_type": "linear"}},
            "zero_optimization": zero, **{k: v for k, v in extra.items() if k in ("fp16", "bf16")}}


def make_engine(case, world, nvme_dir=None, stage=None):
    if nvme_dir is not None:
        os.makedirs(nvme_dir, exist_ok=True)
    model = build_model(dropout=0.1 if case.endswith("dropout") else 0.0)
    engine, *_ = initialize(model=model, config=config(case, world, stage, nvme_dir),
                            model_parameters=groups(model) if case.endswith("groups") else None)
    return engine


def train(e, rank, world, steps):
    for _ in range(steps):
        idx, targets = make_batch(CFG, GLOBAL_BATCH, seed=1000 + e.global_steps)
        n = GLOBAL_BATCH // world
        _, loss = e(idx[rank * n:(rank + 1) * n], targets[rank * n:(rank + 1) * n])
        e.backward(loss)
        e.step()


def full_state(e):
    """Full parameters (fp32), and the full fp32 master weights gathered here without the checkpoint code."""
    opt, names = e.optimizer, {id(p): n for n, p in e.module.named_parameters()}
    params = opt.state_dict() if opt.stage == 3 else dict(e.module.state_dict())
    masters = {}
    for b in opt.buckets:
        master = b.partition.master
        if master is None:  # NVMe: fp32 training, so the parameters are the masters
            masters.update({names[id(p)]: params[names[id(p)]].float() for p in b.params})
            continue
        flat = master.float()
        if opt.stage > 0 and opt.world_size > 1:
            flat = torch.empty(b.layout.padded_numel)
            comm.all_gather(flat, master.float(), group=opt.group)
        masters.update({names[id(p)]: t.clone() for p, t in zip(b.params, b.layout.unflatten(flat))})
    return {k: v.detach().float().clone() for k, v in params.items()}, masters


def save_and_resume(rank, world, root):
    """Per case: A trains K steps, saves, trains K more; B is a new engine that loads A's checkpoint
    and trains the same K steps. Returns A's and B's final states, and A's state at the save."""
    out = {}
    for case in CASES:
        d = os.path.join(root, case)
        a = make_engine(case, world, os.path.join(root, f"nvme_a{rank}"))
        train(a, rank, world, K)
        at_save = full_state(a)
        a.save_checkpoint(d, client_state={"epoch": 1, "note": case})
        train(a, rank, world, K)
        b = make_engine(case, world, os.path.join(root, f"nvme_b{rank}"))
        path, client = b.load_checkpoint(d, load_rng_state=case.endswith("dropout"))
        assert path == os.path.join(d, f"global_step{K}") and client == {"epoch": 1, "note": case}
        assert (b.global_steps, b.global_samples, b.micro_steps) == (K, K * GLOBAL_BATCH, K)
        train(b, rank, world, K)
        out[case] = dict(a=full_state(a)[0], b=full_state(b)[0], at_save=at_save,
                         scale=[a.loss_scale, b.loss_scale], lr=[a.get_lr(), b.get_lr()])
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ckpt"))
    return root, zero_ref.launch(save_and_resume, 2, root, timeout=240)


def test_resume_is_bit_identical_at_every_stage(saved):
    _, results = saved
    for case in CASES:
        for rank, r in enumerate(results):
            for k, v in r[case]["a"].items():
                assert torch.equal(v, r[case]["b"][k]), f"{case} rank {rank}: {k} differs after resuming"
    a, b = results[0]["stage2_fp16"]["scale"]
    assert a == b > 2**12  # the fp16 loss scale grew (window 2) and B continued from where A was
    assert all(r[c]["lr"][0] == r[c]["lr"][1] for r in results for c in CASES)


def test_shard_files_hold_the_bytes_of_the_formula(saved):
    root, _ = saved
    model = build_model()
    psi = sum(p.numel() for p in model.parameters() if p.requires_grad)
    everything = sum(p.numel() for p in model.parameters())  # + the frozen position embedding
    for case in ("stage0", "stage1", "stage2", "stage3", "stage3_bf16"):
        stage, bp = CASES[case][0], 2 if "bf16" in case else 4
        reader = Reader(os.path.join(root, case, "global_step3"))
        assert (reader.meta["world_size"], reader.meta["stage"]) == (2, stage)
        expect = checkpoint.checkpoint_bytes(psi, zero_stage=stage, dp=2, precision="bf16" if bp == 2 else "fp32")
        optim = [reader.state_bytes(f"optim_states_rank00{r}.pt") for r in (0, 1)]
        # 12 bytes (master, exp_avg, exp_avg_sq) per trainable element, each written once; padding is not written
        assert sum(optim) == 12 * psi and max(optim) <= expect["optim_per_rank"] + 12 * len(reader.meta["index"]["optim"])
        if stage == 3:
            params = [reader.state_bytes(f"param_states_rank00{r}.pt") for r in (0, 1)]
            per_rank = checkpoint.checkpoint_bytes(everything, zero_stage=3, dp=2, precision="fp32" if bp == 4 else "bf16")
            # every unit (15) is padded on its own: rank 0's shards hold ≤ 1 element more per unit
            assert sum(params) == bp * everything and max(params) <= per_rank["params_per_rank"] + bp * 15
            assert reader.state_bytes("model_states.pt") == 0  # (this model has no buffers)
        else:
            assert reader.state_bytes("model_states.pt") == expect["rank0_params"] + bp * (everything - psi)
        for f, n in reader.meta["file_bytes"].items():  # on disk: the payload plus the zip/pickle framing
            assert n == os.path.getsize(os.path.join(reader.path, f)) and n >= reader.state_bytes(f)


def test_consolidation_equals_the_fp32_master_weights(saved, tmp_path):
    root, results = saved
    for case in CASES:
        params, masters = results[0][case]["at_save"]
        state = get_fp32_state_dict_from_zero_checkpoint(os.path.join(root, case))
        assert list(state) == list(build_model().state_dict())  # every key, in state_dict order
        for k, v in state.items():
            assert v.dtype == torch.float32
            ref = masters.get(k, masters["tok_emb.weight"] if k == "head.weight" else params[k])
            assert torch.equal(v, ref), f"{case}: {k}"
    assert state["head.weight"] is state["tok_emb.weight"]  # tied: one tensor under both names
    out = tmp_path / "fp32.pt"
    run = subprocess.run([sys.executable, "-m", "zero_ref.ds.utils.zero_to_fp32", os.path.join(root, "stage3_bf16"), str(out)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "read stage 3, 2 rank(s), step 3; wrote 29 tensors, 13377 elements, 53508 bytes" in run.stdout
    from_cli = torch.load(out, weights_only=True)
    masters = results[0]["stage3_bf16"]["at_save"][1]
    assert all(torch.equal(from_cli[k], masters[k]) for k in masters)


def load_elsewhere(rank, world, root, stage_of):
    """Load each 2-rank checkpoint at ``world`` ranks (into ``stage_of[case]``), gather the loaded state, train K."""
    out = {}
    for case, stage in stage_of.items():
        e = make_engine(case, world, os.path.join(root, f"nvme_c{rank}"), stage=stage)
        e.load_checkpoint(os.path.join(root, case))
        loaded = full_state(e)
        train(e, rank, world, K)
        out[case] = dict(loaded=loaded, final=full_state(e)[0])
    return out


@pytest.mark.parametrize("world,shift", [(1, 0), (3, 1)])
def test_resume_at_another_dp_size_and_stage(saved, world, shift):
    # shift 1: also at the next stage (0→1, 1→2, 2→3, 3→0): the files do not depend on the stage.
    root, results = saved
    cases = ["stage0", "stage1", "stage2", "stage3", "stage3_bf16"]
    stage_of = {c: (CASES[c][0] + shift) % 4 for c in cases}
    got = zero_ref.launch(load_elsewhere, world, root, stage_of, timeout=240)
    for case in cases:
        ref_params, ref_masters = results[0][case]["at_save"]
        for r in got:
            params, masters = r[case]["loaded"]
            # Re-sharding moves elements, it computes nothing: the loaded state is the saved one, bit for bit.
            assert all(torch.equal(params[k], ref_params[k]) for k in ref_params), case
            assert all(torch.equal(masters[k], ref_masters[k]) for k in ref_masters), case
            # Training on from there adds the gradients of 12 samples over another number of ranks, so in
            # another order: fp32 rounding differs in the last bits and Adam carries it (see ADAM's eps in
            # tests/zero_ref/cases.py); measured ≤ 3e-7 after 3 steps, 1e-5 as elsewhere in the ZeRO tests.
            final, ref = r[case]["final"], results[0][case]["a"]
            diff = max((final[k] - ref[k]).abs().max().item() for k in ref)
            assert diff <= (1e-5 if "bf16" not in case else 2 * ADAM.lr), (case, diff)


def crash_mid_save(rank, world, root, kill):
    e = make_engine("stage2", world)
    train(e, rank, world, 1)
    e.save_checkpoint(root, tag="good")
    good = full_state(e)[0]
    train(e, rank, world, 1)
    real_save = sharded._save_file

    def failing(obj, path):
        if rank == 1 and "optim_states" in path:
            with open(path, "wb") as f:  # half a file, then the failure
                f.write(b"PK\x03\x04 partial")
                f.flush()
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(28, "No space left on device (injected)")
        return real_save(obj, path)

    sharded._save_file = failing
    try:
        e.save_checkpoint(root, tag="bad")
    except CheckpointError as err:
        assert "failed on rank(s) [1]" in str(err)
        return good
    raise AssertionError("the failed save did not raise")


@pytest.mark.parametrize("kill", [False, True], ids=["raise", "sigkill"])
def test_a_crash_mid_save_leaves_the_previous_checkpoint(tmp_path, kill):
    root = str(tmp_path)
    if kill:
        with pytest.raises(zero_ref.RankError):  # (rank 0 may report first: its peer vanished mid-collective)
            zero_ref.launch(crash_mid_save, 2, root, kill, timeout=120, echo=False)
        assert any(n.startswith(".bad.tmp-") for n in os.listdir(root))  # the half-written save, never renamed
    else:
        good = zero_ref.launch(crash_mid_save, 2, root, kill, timeout=120)[0]
        assert not any(n.startswith(".bad") for n in os.listdir(root))  # the ranks agreed, rank 0 cleaned up
    assert open(os.path.join(root, "latest")).read() == "good" and not os.path.exists(os.path.join(root, "bad"))
    state = get_fp32_state_dict_from_zero_checkpoint(root)  # every file of "good" reads back, sizes as recorded
    if not kill:
        assert all(torch.equal(state[k], good[k]) for k in good)


class Payload:
    """Unpickling this runs a shell command (what a malicious checkpoint would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_would_run_code_is_refused(saved, tmp_path):
    import shutil
    root, _ = saved
    d = tmp_path / "ckpt"
    shutil.copytree(os.path.join(root, "stage1"), d)
    path = d / "global_step3"
    marker = tmp_path / "pwned"
    meta = json.loads((path / "metadata.json").read_text())
    for victim, writer, refusal in (
            ("model_states.pt", lambda f: torch.save({"module": Payload(marker)}, f), ".*could run code"),
            ("optim_states_rank001.pt", lambda f: f.write(pickle.dumps(Payload(marker))), ": it is not a torch.save zip")):
        original, size = (path / victim).read_bytes(), meta["file_bytes"][victim]
        with open(path / victim, "wb") as f:
            writer(f)
        meta["file_bytes"][victim] = os.path.getsize(path / victim)  # the attacker fixes the recorded size too
        (path / "metadata.json").write_text(json.dumps(meta))
        with pytest.raises(CheckpointError, match=f"refused to load .*{victim}{refusal}"):
            get_fp32_state_dict_from_zero_checkpoint(str(d))
        assert not marker.exists()
        (path / victim).write_bytes(original)
        meta["file_bytes"][victim] = size
    # the recorded size catches a replaced or truncated file before it is unpickled at all
    (path / "optim_states_rank000.pt").write_bytes(b"\x80\x04N.")
    with pytest.raises(CheckpointError, match="optim_states_rank000.pt is 4 bytes; the checkpoint recorded"):
        Reader(str(path)).read("blocks.0.mlp.fc1.weight", "master")


def wrong_loads(rank, world, root):
    from zero_ref.models import GPT, GPTConfig
    errors = []
    e = make_engine("stage2", world)
    for call in (lambda: e.load_checkpoint(os.path.join(root, "stage2"), tag="global_step9"),
                 lambda: e.save_checkpoint(root, tag="../up")):
        try:
            call()
        except (CheckpointError, ValueError) as err:
            errors.append(str(err))
    assert e.load_checkpoint(os.path.join(root, "nowhere")) == (None, None)  # DeepSpeed's: no 'latest', nothing
    torch.manual_seed(0)
    other = GPT(GPTConfig(vocab_size=97, seq_len=8, d_model=21, n_heads=3, n_layers=2, ffn_mult=5))
    other.pos_emb.weight.requires_grad_(False)
    e, *_ = initialize(model=other, config=config("stage1", world))
    try:
        e.load_checkpoint(os.path.join(root, "stage1"))
    except CheckpointError as err:
        errors.append(str(err))
    e = make_engine("stage3", world)  # one param group, where the checkpoint has two
    try:
        e.load_checkpoint(os.path.join(root, "stage3_groups"))
    except CheckpointError as err:
        errors.append(str(err))
    os.remove(os.path.join(root, "stage0", "global_step3", "optim_states_rank001.pt"))
    e = make_engine("stage0", world)
    try:
        e.load_checkpoint(os.path.join(root, "stage0"))
    except CheckpointError as err:
        errors.append(str(err))
    return errors


def test_wrong_checkpoints_are_clear_errors(saved, tmp_path):
    import shutil
    root, _ = saved
    for case in ("stage0", "stage1", "stage2", "stage3_groups"):
        shutil.copytree(os.path.join(root, case), tmp_path / case)
    missing_tag, bad_tag, shape, groups, missing_file = zero_ref.launch(wrong_loads, 1, str(tmp_path), timeout=120)[0]
    assert "was saved with 2 param groups, the optimizer has 1" in groups
    assert "no checkpoint 'global_step9'" in missing_tag and "tags there: ['global_step3']" in missing_tag
    assert "must be a plain file name" in bad_tag
    assert "parameter 'blocks.0.mlp.fc1.weight': the checkpoint has shape (84, 21), the model (105, 21)" in shape
    assert "is missing optim_states_rank001.pt" in missing_file


def deepspeed_save(rank, world, root):
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    out = {}
    for stage in (0, 1, 2, 3):
        model = build_model()
        ds_config = {**config("stage0", world), "zero_optimization": {"stage": stage}}
        del ds_config["scheduler"]
        ds_config["optimizer"]["params"]["torch_adam"] = True  # torch's AdamW: DeepSpeed's CPU FusedAdam is a C++ build
        engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                          config=ds_config)
        train(engine, rank, world, 1)
        engine.save_checkpoint(os.path.join(root, f"stage{stage}"))
        out[stage] = sorted(os.listdir(os.path.join(root, f"stage{stage}", "global_step1")))
    return out


def test_deepspeed_layout_for_comparison(tmp_path):
    # The names chapter 27 sets beside ours, and why DeepSpeed's files need weights_only=False to load.
    pytest.importorskip("deepspeed")
    names = zero_ref.launch(deepspeed_save, 2, str(tmp_path), timeout=300, echo=False)[0]
    for stage in (0, 1, 2, 3):
        assert names[stage] == checkpoint.deepspeed_file_names(stage, 2), stage
        assert set(os.listdir(tmp_path / f"stage{stage}")) >= {"latest"} | ({"zero_to_fp32.py"} if stage else set())
    optim = tmp_path / "stage1" / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    with pytest.raises(pickle.UnpicklingError, match="deepspeed.runtime.fp16.loss_scaler.LossScaler"):
        torch.load(optim, weights_only=True)  # it pickles a Python object: only an unsafe load reads it


def test_checkpoint_bytes_under_3d_divide_the_parameters_over_model_parallel_positions():
    """The seed's 65B plan, TP 8 × PP 8 × DP 4 with ZeRO-1: each of the 64 (tp, pp) positions writes its own
    2Ψ/64 of bf16 parameters (one folder per position, as ThreeD.save_checkpoint does), not 2Ψ on rank 0."""
    psi = 65_000_000_000
    flat = checkpoint.checkpoint_bytes(psi, zero_stage=1, dp=256)
    three_d = checkpoint.checkpoint_bytes(psi, zero_stage=1, dp=256, mp=64)
    assert flat["rank0_params"] == 2 * psi and three_d["rank0_params"] == 2 * -(-psi // 64)
    assert three_d["optim_per_rank"] == flat["optim_per_rank"] == 12 * -(-psi // 256)
    assert three_d["largest_rank"] == 12 * -(-psi // 256) + 2 * -(-psi // 64)      # ≈ 5.08 GB, not 133 GB
    assert three_d["total"] == flat["total"] == 14 * psi
    assert checkpoint.checkpoint_bytes(psi, zero_stage=3, dp=256, mp=64)["rank0_params"] == 0
    with pytest.raises(ValueError, match="mp"):
        checkpoint.checkpoint_bytes(psi, zero_stage=1, dp=256, mp=3)
