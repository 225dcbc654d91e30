"""ZeRO-Infinity's NVMe tier: byte-exact round trips, sub-groups with prefetch, the error cases, atomic versions.

The swap files go to a temporary directory (any filesystem: what is tested is the I/O path, the
versioning and the arithmetic, not NVMe speed). "Full" and "read-only" use tiny tmpfs mounts when the
tests run as root (they do in CI and here), and are skipped otherwise; the mid-step write failure is a
real one either way: a file-size limit (``RLIMIT_FSIZE``) in the launched ranks makes ``pwrite`` fail
with EFBIG partway through the step.
"""
import contextlib
import os
import subprocess
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zero_ref
from zero_ref import offload
from zero_ref.offload import nvme
from zero_ref.memory import offload_placement
from tests.zero_ref.cases import ADAM, build_model, max_diff, micro_batch

WORLD, STEPS = 2, 3


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def random_tensor(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every bit pattern (NaNs, infinities, subnormals included): random bytes viewed as ``dtype``."""
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return raw.view(dtype)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# ------------------------------------------------------------------ the store: round trips and versions

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 40_000), min_size=1, max_size=4),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.float64]),
       block=st.sampled_from([1, 512, 4096, 1 << 20]), threads=st.integers(1, 3), depth=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_round_trips_are_byte_exact(sizes, dtype, block, threads, depth, seed):
    with tempfile.TemporaryDirectory() as root:
        io = nvme.AsyncFileIO(block_size=block * 13 if block == 1 else block, queue_depth=depth,
                              intra_op_parallelism=threads)
        store = nvme.VersionedStore(root, io)
        tensors = {f"t{i}": random_tensor(n, dtype, seed + i) for i, n in enumerate(sizes)}
        store.begin()
        for key, t in tensors.items():
            store.write(key, t)
        store.commit()
        for key, t in tensors.items():
            out = torch.empty_like(t)
            store.read(key, out).result()
            assert same_bytes(out, t)
            assert os.path.getsize(os.path.join(store.dir, f"{key}.v1")) == t.numel() * t.element_size()
        # A second version replaces one key; the others stay at version 1; old files are deleted.
        store.begin()
        new = random_tensor(sizes[0], dtype, seed + 99)
        store.write("t0", new)
        store.commit()
        assert store.load_manifest() == {"t0": 2, **{k: 1 for k in tensors if k != "t0"}}
        out = torch.empty_like(new)
        store.read("t0", out).result()
        assert same_bytes(out, new)
        assert sorted(os.listdir(store.dir)) == sorted(["CURRENT", "t0.v2"] + [f"{k}.v1" for k in tensors if k != "t0"])
        io.close()
        store.close()


def test_a_failed_write_keeps_the_previous_version():
    with tempfile.TemporaryDirectory() as root:
        io = nvme.AsyncFileIO()
        store = nvme.VersionedStore(root, io)
        old = {k: random_tensor(1000, torch.float32, i) for i, k in enumerate("abc")}
        store.begin()
        for k, t in old.items():
            store.write(k, t)
        store.commit()
        store.begin()
        store.fail_after = 1  # the second write of this version fails with ENOSPC
        for k in old:
            store.write(k, torch.zeros(1000))
        with pytest.raises(nvme.SwapError, match="No space left on device.*still hold the previous version"):
            store.commit()
        assert store.load_manifest() == {"a": 1, "b": 1, "c": 1} and not store.is_open
        assert sorted(os.listdir(store.dir)) == ["CURRENT", "a.v1", "b.v1", "c.v1"]  # the new files are gone
        for k, t in old.items():
            out = torch.empty_like(t)
            store.read(k, out).result()
            assert same_bytes(out, t)
        io.close()
        store.close()


# ------------------------------------------------------------------ sub-groups and the swapper

def test_sub_group_plan_is_deepspeeds():
    assert nvme.sub_group_plan([4, 4, 4, 10, 1], 8) == [[0, 1], [2, 3], [4]]
    assert nvme.sub_group_plan([4, 4, 4], 100) == [[0, 1, 2]]  # everything fits: one sub-group
    assert nvme.sub_group_plan([4, 4, 4], 1) == [[0], [1], [2]]
    assert nvme.sub_group_plan([9, 1, 1], 5) == [[0], [1, 2]]  # the last sub-group may stay small


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(numels=st.lists(st.integers(1, 3000), min_size=1, max_size=6), group=st.integers(1, 8000),
       buffers=st.integers(3, 12), pipeline_read=st.booleans(), pipeline_write=st.booleans())
def test_the_swapper_equals_in_memory_state(numels, group, buffers, pipeline_read, pipeline_write):
    if (pipeline_read or pipeline_write) and buffers < 6:
        buffers = 6  # (a smaller pool refuses pipelining: tested below)
    plan = nvme.sub_group_plan(numels, group)
    sizes = [sum(numels[j] for j in g) for g in plan]
    ref = [[random_tensor(n, torch.float32, 0).clamp(-1, 1).nan_to_num() for _ in range(3)] for n in sizes]
    with tempfile.TemporaryDirectory() as root:
        store = nvme.VersionedStore(root, nvme.AsyncFileIO(block_size=4096, queue_depth=4))
        swapper = nvme.SubGroupSwapper(store, sizes, buffer_count=buffers, pipeline_read=pipeline_read,
                                       pipeline_write=pipeline_write)
        store.begin()
        for i, states in enumerate(ref):
            swapper.write_initial(i, states)
        store.commit()

        def update(i, states):  # any deterministic, in-place update of the three states
            states[0].add_(states[1], alpha=i + 1)
            states[1].mul_(0.5).add_(states[2])
            states[2].sub_(0.25)

        for _ in range(2):
            store.begin()
            swapper.run(update)
            store.commit()
            for i, states in enumerate(ref):
                update(i, states)
            order = swapper.schedule
            model = nvme.swap_timeline([1.0] * len(sizes), [1.0] * len(sizes), [1.0] * len(sizes), buffer_count=buffers,
                                       pipeline_read=pipeline_read, pipeline_write=pipeline_write)
            assert [(k, i) for k, i, _, _ in model] == [x for x in order if x[0] != "wait-write"]  # the model's order
            for i in range(len(sizes)):  # read, then step, then write, for every sub-group
                assert order.index(("read", i)) < order.index(("step", i)) < order.index(("write", i))
                if pipeline_read and i + 1 < len(sizes):  # prefetch: i+1 is read before i steps
                    assert order.index(("read", i + 1)) < order.index(("step", i))
                if not pipeline_read and i + 1 < len(sizes):
                    assert order.index(("read", i + 1)) > order.index(("write", i))
        for i, states in enumerate(ref):
            out = torch.empty(3 * sizes[i])
            store.read(swapper.key(i), out).result()
            assert torch.equal(out, torch.cat(states))
        resident = swapper.slots * 3 * max(sizes) * 4
        assert sum(b.numel() * 4 for b in swapper.buffers) <= resident  # never more than buffer_count buffers
        store.io.close()
        store.close()


def test_swap_timeline_by_hand():
    # Serial: read, step, write, one sub-group after the other: 3 × (2 + 3 + 1) = 18.
    serial = nvme.swap_timeline([2] * 3, [3] * 3, [1] * 3)
    assert max(e for *_, e in serial) == 18
    # Prefetch + background writes: reads hide behind steps; the FIFO queue makes read 2 wait for write 0.
    piped = nvme.swap_timeline([2] * 3, [3] * 3, [1] * 3, buffer_count=9, pipeline_read=True, pipeline_write=True)
    assert [(k, i, s, e) for k, i, s, e in piped] == [
        ("read", 0, 0, 2), ("read", 1, 2, 4), ("step", 0, 2, 5), ("write", 0, 5, 6), ("read", 2, 6, 8),
        ("step", 1, 5, 8), ("write", 1, 8, 9), ("step", 2, 8, 11), ("write", 2, 11, 12)]
    with pytest.raises(ValueError, match="two to pipeline"):
        nvme.swap_timeline([1], [1], [1], buffer_count=4, pipeline_read=True)


def test_pipelining_needs_two_sub_groups_of_buffers():
    with tempfile.TemporaryDirectory() as root:
        store = nvme.VersionedStore(root, nvme.AsyncFileIO())
        with pytest.raises(ValueError, match=r"buffer_count=4 holds one sub-group.*need buffer_count >= 6"):
            nvme.SubGroupSwapper(store, [10, 10], buffer_count=4, pipeline_read=True)
        with pytest.raises(ValueError, match="buffer_count=2 is too small"):
            nvme.SubGroupSwapper(store, [10], buffer_count=2)
        store.io.close()


# ------------------------------------------------------------------ nvme_path checks (before training)

@contextlib.contextmanager
def tmpfs(size: str, readonly: bool = False):
    """A tmpfs of ``size`` mounted on a fresh directory (root only); skips the test otherwise."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = tempfile.mkdtemp(prefix="zero_ref_tmpfs_")
    opts = f"size={size}" + (",ro" if readonly else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path], capture_output=True, text=True)
    if done.returncode:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", path], check=False)
        os.rmdir(path)


def test_missing_or_not_a_directory(tmp_path):
    with pytest.raises(ValueError, match=r"offload_optimizer.nvme_path='.*nope' does not exist"):
        nvme.check_nvme_path(tmp_path / "nope", 10)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        nvme.check_nvme_path(tmp_path / "file", 10)
    with pytest.raises(ValueError, match="nvme_path is required"):
        nvme.check_nvme_path(None, 10)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize  # the real filesystem's free space
    with pytest.raises(ValueError, match="bytes free but the swap files need"):
        nvme.check_nvme_path(tmp_path, free + 10**15)
    assert nvme.check_nvme_path(tmp_path, 10) == str(tmp_path)


def test_unwritable_path():
    with tmpfs("1m", readonly=True) as path:
        with pytest.raises(ValueError, match="is not writable: Read-only file system"):
            nvme.check_nvme_path(path, 10)


# ------------------------------------------------------------------ real runs on two ranks

def nvme_runs(rank, world, root, runs):
    """Stage 3 on every config of ``runs``; the model state, bytes per tier and NVMe bytes per step of each."""
    from zero_ref.stages import ZeroStage3

    out = {}
    for name, (precision, off, par, sub_group, buffers, pipeline, adam) in runs.items():
        model = build_model()
        model.pos_emb.weight.requires_grad_(True)
        off_cfg = {"device": off} if off in ("cpu", None) else \
            {"device": "nvme", "nvme_path": root, "buffer_count": buffers, "pipeline_read": pipeline,
             "pipeline_write": pipeline}
        opt = ZeroStage3(model, adam=ADAM, precision=precision, param_persistence_threshold=0,
                         offload_optimizer=off and off_cfg, offload_param=par and {"device": par, "nvme_path": root},
                         sub_group_size=sub_group, cpu_adam=adam, aio={"block_size": 4096, "queue_depth": 4})
        per_step, schedule = [], None
        for step in range(STEPS):
            log = opt.offload.log if opt.offload else None
            if log:
                log.clear()
            _, loss = model(*micro_batch(step, 0, rank, world, 1))
            opt.backward(loss)
            opt.step()
            if log:
                per_step.append((log.bytes("read"), log.bytes("write"),
                                 sum(e.nbytes for e in log.events if e.kind == "read" and e.key.startswith("param"))))
                schedule = opt.offload.swapper.schedule
        out[name] = dict(state={k: v.float() for k, v in opt.state_dict().items()}, tiers=offload.tier_bytes(opt),
                         shards={u.name: u.layout.shard_numel for u in opt.units}, per_step=per_step,
                         groups=[[b.name for b in g] for g in opt.offload.sub_groups] if off == "nvme" else None,
                         schedule=schedule)
        if opt.offload:
            opt.offload.close()
    return out


RUNS = {  # name: (precision, offload_optimizer, offload_param, sub_group_size, buffer_count, pipeline, cpu_adam)
    **{f"{p}/memory": (p, None, None, 10**9, 4, False, "torch") for p in ("fp32", "bf16")},
    **{f"{p}/cpu": (p, "cpu", None, 10**9, 4, False, "torch") for p in ("fp32", "bf16")},
    "fp32/nvme one group": ("fp32", "nvme", None, 10**9, 4, False, "torch"),
    "fp32/nvme groups of 1": ("fp32", "nvme", None, 1, 4, False, "torch"),
    "fp32/nvme groups of 700, pipelined": ("fp32", "nvme", None, 700, 9, True, "torch"),
    "bf16/nvme groups of 700, pipelined": ("bf16", "nvme", None, 700, 6, True, "torch"),
    "bf16/nvme + params nvme": ("bf16", "nvme", "nvme", 700, 6, True, "torch"),
    "bf16/nvme + params cpu": ("bf16", "nvme", "cpu", 700, 4, False, "torch"),
    "fp32/cpu numba": ("fp32", "cpu", None, 10**9, 4, False, "numba"),
    "fp32/nvme numba": ("fp32", "nvme", None, 700, 6, True, "numba"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("nvme"))
    results = zero_ref.launch(nvme_runs, WORLD, root, RUNS, timeout=240)
    assert os.listdir(root) == []  # every rank's swap directory is removed with its optimizer
    return results



@pytest.mark.slow
def test_nvme_runs_equal_in_memory_runs_bit_for_bit(runs):
    for res in runs:
        for name, r in res.items():
            precision, off, _, _, _, _, adam = RUNS[name]
            ref = res[f"{precision}/cpu numba" if adam == "numba" else f"{precision}/memory"]["state"]
            assert max_diff(r["state"], ref) == 0, name  # any sub-group size, pipelined or not, params anywhere
        groups = res["fp32/nvme groups of 1"]["groups"]
        assert all(len(g) == 1 for g in groups) and len(res["fp32/nvme one group"]["groups"]) == 1
        assert 1 < len(res["fp32/nvme groups of 700, pipelined"]["groups"]) < len(groups)


@pytest.mark.slow
def test_nvme_bytes_per_step_equal_the_formula(runs):
    for name, r in runs[0].items():
        precision, off, par, *_ = RUNS[name]
        if off != "nvme":
            continue
        shards, size = r["shards"], (4 if precision == "fp32" else 2)
        padded = WORLD * sum(shards.values())
        f = offload.nvme_bytes_per_step(padded, dp=WORLD, precision=precision, offload_param=par == "nvme")
        gathers = 2 * sum(shards.values()) + shards["tok_emb"] - shards["pos_emb"]  # forward + backward
        reads, writes, param_reads = r["per_step"][-1]
        assert writes == f["write"], name  # 12 B per element of the partition (+ the 16-bit partition)
        if par == "nvme":  # each gather reads the unit's partition: ≈ 2 per step, as the formula assumes
            assert param_reads == size * gathers and reads - param_reads == 12 * sum(shards.values())
            assert abs(reads - f["read"]) <= size * shards["tok_emb"]
        else:
            assert reads == f["read"] and param_reads == 0, name
        assert r["per_step"][0] == r["per_step"][-1]  # the same every step


@pytest.mark.slow
def test_bytes_per_tier_equal_offload_placement(runs):
    for name, r in runs[0].items():
        precision, off, par, *_ = RUNS[name]
        if off != "nvme":
            continue
        padded = WORLD * sum(r["shards"].values())
        f = offload_placement(padded, zero_stage=3, dp=WORLD, precision=precision, offload_optimizer="nvme",
                              offload_param=par or "none")
        expected = {t: {k: int(v) for k, v in f[t].as_dict().items() if k != "total"} for t in ("gpu", "cpu", "nvme")}
        if precision == "fp32":  # the swapped master is separate from the fp32 parameters: + 4Ψ/N
            expected["nvme"]["optimizer"] += 4 * padded // WORLD
        # zero_ref keeps the fp32 gradient partition in host memory (DeepSpeed writes it to NVMe at the
        # boundary and reads it back in the step): 4Ψ/N on the host instead of on NVMe.
        expected["cpu"]["grads"], expected["nvme"]["grads"] = expected["nvme"]["grads"], 0
        assert {t: r["tiers"][t] for t in ("gpu", "cpu", "nvme")} == expected, name
        buffers = RUNS[name][4]
        largest = max(sum(r["shards"][u] for u in g) for g in r["groups"])
        assert r["tiers"]["cpu_buffers"] == min(buffers // 3, len(r["groups"])) * 3 * 4 * largest


@pytest.mark.slow
def test_prefetch_schedule(runs):
    r = runs[0]["fp32/nvme groups of 700, pipelined"]
    n = len(r["groups"])
    s = r["schedule"]
    for i in range(n - 1):  # sub-group i+1 is read before sub-group i steps
        assert s.index(("read", i + 1)) < s.index(("step", i))
    serial = runs[0]["fp32/nvme groups of 1"]["schedule"]
    assert serial == [x for i in range(len(serial) // 3) for x in (("read", i), ("step", i), ("write", i))]


# ------------------------------------------------------------------ failures: real errors, consistent state

def failing_run(rank, world, roots, mode, full_root):
    """One good step; then a write fails mid-step (EFBIG from RLIMIT_FSIZE, or ENOSPC on this rank's own,
    filled tmpfs); then training goes on. Also: a path too small refuses the configuration before training."""
    import resource

    from zero_ref.offload.nvme import SwapError
    from zero_ref.stages import ZeroStage3

    root, result = roots[rank], {}
    if full_root:
        try:
            ZeroStage3(build_model(), adam=ADAM, offload_optimizer={"device": "nvme", "nvme_path": full_root})
        except ValueError as e:
            result["full"] = str(e)

    def make():
        model = build_model()
        opt = ZeroStage3(model, adam=ADAM, param_persistence_threshold=0, cpu_adam="torch", sub_group_size=1,
                         offload_optimizer={"device": "nvme", "nvme_path": root, "buffer_count": 6,
                                            "pipeline_read": True, "pipeline_write": mode == "fsize"})
        return model, opt

    def train_step(model, opt, step):
        _, loss = model(*micro_batch(step, 0, rank, world, 1))
        opt.backward(loss)
        return opt.step()

    def committed(opt):
        out = []
        for i, g in enumerate(opt.offload.sub_groups):
            t = torch.empty(3 * sum(b.layout.shard_numel for b in g))
            opt.offload.store.read(f"optim{i}", t).result()
            out.append(t)
        return out

    model, opt = make()
    train_step(model, opt, 0)
    store = opt.offload.store
    before = dict(state=opt.state_dict(), states=committed(opt), manifest=store.load_manifest(),
                  files=sorted(os.listdir(store.dir)))
    sizes = [12 * sum(b.layout.shard_numel for b in g) for g in opt.offload.sub_groups]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    filler = None
    if mode == "fsize":  # sub-groups 0..j-1 fit under the limit, sub-group j does not
        j = next(i for i, s in enumerate(sizes) if i > 0 and s > max(sizes[:i]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (max(sizes[:j]), hard))
    else:  # fill the tmpfs but the pages of sub-group 0's new file: sub-group 1's file finds no room
        j, page = 1, os.statvfs(root).f_frsize
        filler = os.path.join(root, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * (os.statvfs(root).f_bavail * page - -(-sizes[0] // page) * page))
    try:
        train_step(model, opt, 1)
        result["raised"] = None
    except SwapError as e:
        result["raised"] = str(e)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        if filler:
            os.unlink(filler)
    after = dict(state=opt.state_dict(), states=committed(opt), manifest=store.load_manifest(),
                 files=sorted(os.listdir(store.dir)))
    result["unchanged"] = {k: (all(torch.equal(x, y) for x, y in zip(before[k].values(), after[k].values()))
                               if k == "state" else
                               all(torch.equal(x, y) for x, y in zip(before[k], after[k])) if k == "states" else
                               before[k] == after[k]) for k in before}
    result["adam_steps"] = opt.adam_steps
    result["written_before_failure"] = j
    train_step(model, opt, 2)  # training goes on from the previous state
    result["final"] = opt.state_dict()
    ref_model, ref_opt = make()  # the same, without the failed step
    train_step(ref_model, ref_opt, 0)
    train_step(ref_model, ref_opt, 2)
    result["reference"] = ref_opt.state_dict()
    return result


def check_failure(results, mode):
    for r in results:
        assert r["raised"] is not None and "still hold the previous version" in r["raised"], r["raised"]
        assert ("File too large" if mode == "fsize" else "No space left on device") in r["raised"]
        assert r["written_before_failure"] >= 1  # the failure really came mid-step, after some sub-groups
        assert r["unchanged"] == {"state": True, "states": True, "manifest": True, "files": True}
        assert r["adam_steps"] == 1
        assert all(torch.equal(r["final"][k], r["reference"][k]) for k in r["reference"])  # the failed step left no trace


def helper_failure_run(rank, world, root):
    """A failed write in the offload helper's step leaves its caller's fields alone (it raises); the
    stage's step is the one that drops the step: its counter back, its gradients cleared."""
    from zero_ref.offload.nvme import SwapError
    from zero_ref.stages import ZeroStage3

    model = build_model()
    opt = ZeroStage3(model, adam=ADAM, param_persistence_threshold=0, cpu_adam="torch", sub_group_size=1,
                     offload_optimizer={"device": "nvme", "nvme_path": root})

    def backward(step):
        _, loss = model(*micro_batch(step, 0, rank, world, 1))
        opt.backward(loss)

    backward(0)
    opt.step()
    backward(1)
    grads = [b.partition.grad.clone() for b in opt.buckets]
    result = {}
    opt.offload.store.fail_after = 1
    try:
        opt.offload.step(opt, [b.partition.grad for b in opt.buckets])
    except SwapError as e:
        result["helper"] = str(e)
    result["helper_left_steps"] = opt.adam_steps
    result["helper_left_grads"] = all(torch.equal(b.partition.grad, g) for b, g in zip(opt.buckets, grads))
    opt.offload.store.fail_after = 1
    try:
        opt.step()
    except SwapError as e:
        result["stage"] = str(e)
    result["stage_left_steps"] = opt.adam_steps
    result["stage_zeroed_grads"] = all(not b.partition.grad.any() for b in opt.buckets)
    return result


def test_the_offload_helper_raises_and_the_stage_rolls_back(tmp_path):
    r = zero_ref.launch(helper_failure_run, 1, str(tmp_path), timeout=120)[0]
    assert "still hold the previous version" in r["helper"] and "still hold the previous version" in r["stage"]
    assert r["helper_left_steps"] == 1 and r["helper_left_grads"]  # untouched by the helper
    assert r["stage_left_steps"] == 1 and r["stage_zeroed_grads"]  # rolled back by the stage


@pytest.mark.slow
def test_a_write_failure_mid_step_leaves_the_previous_state(tmp_path):
    # RLIMIT_FSIZE: a real EFBIG from pwrite once a swap file would pass the limit (Python ignores SIGXFSZ).
    check_failure(zero_ref.launch(failing_run, WORLD, [str(tmp_path)] * WORLD, "fsize", None, timeout=120), "fsize")


@pytest.mark.slow
def test_a_full_disk_mid_step_and_before_training():
    # One tmpfs per rank (so neither rank takes the other's last free page), and a 16 KiB one.
    with tmpfs("2m") as root0, tmpfs("2m") as root1, tmpfs("16k") as tiny:
        results = zero_ref.launch(failing_run, WORLD, [root0, root1], "enospc", tiny, timeout=120)
    check_failure(results, "enospc")
    assert all("bytes free but the swap files need" in r["full"] for r in results)
