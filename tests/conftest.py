"""Fixtures shared by the multi-rank tests."""
import os

import pytest
import torch


@pytest.fixture
def one_thread():
    """One intra-op thread, as every launched rank runs: a single-process reference computed here
    then adds its reductions in the same order as the ranks do."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_rank(one_thread):
    """A one-process group, as initialize makes one for `python train.py` (no launcher): the launcher's
    RANK / WORLD_SIZE are hidden while it runs and the group is destroyed after it."""
    import torch.distributed as dist
    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.update(env)


# set by pytest itself, by torch's compiler the first time it runs (its cache directory), and by
# importing deepspeed (PYTORCH_NVML_BASED_CUDA_CHECK, in deepspeed/__init__.py)
LIBRARIES_SET = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_", "PYTORCH_NVML_BASED_CUDA_CHECK")


@pytest.fixture(autouse=True)
def environment_unchanged():
    """A test that changes os.environ and leaves it changed alters every later test and the notebook
    kernels nbval starts (a leaked NUMBA_ENABLE_CUDASIM=1 once made numba take the CPU for a GPU):
    fail the test that did it, name the variables, and put them back."""
    before = dict(os.environ)
    yield
    after = {k: v for k, v in os.environ.items() if not k.startswith(LIBRARIES_SET)}
    expected = {k: v for k, v in before.items() if not k.startswith(LIBRARIES_SET)}
    if after != expected:
        changed = sorted(k for k in after.keys() | expected.keys() if after.get(k) != expected.get(k))
        for k in changed:
            if k in expected:
                os.environ[k] = expected[k]
            else:
                del os.environ[k]
        pytest.fail(f"the test left os.environ changed: {', '.join(changed)} (use monkeypatch.setenv)")


# torch's extension loader takes a lock file in the op's build folder at every load, and a process killed while it
# holds it (a rank stopped by a test's timeout) leaves it there: every later load waits on it forever. A load that
# finds the op built holds the lock well under a second and a build on two cores takes a few minutes, so a lock
# older than STALE_LOCK_S is a dead process's: removed before each test that starts DeepSpeed.
STALE_LOCK_S = 600


def remove_stale_extension_locks(now: float | None = None) -> list[str]:
    import time
    from pathlib import Path
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    now = time.time() if now is None else now
    removed = []
    for lock in root.glob("*/*/lock"):
        try:
            if now - lock.stat().st_mtime > STALE_LOCK_S:
                lock.unlink()
                removed.append(str(lock))
        except FileNotFoundError:  # released meanwhile
            pass
    return removed


def pytest_runtest_setup(item):
    if item.get_closest_marker("peers"):
        for lock in remove_stale_extension_locks():
            print(f"removed a stale lock a killed DeepSpeed op load left: {lock}")
