"""Fixtures shared by the multi-rank tests."""
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
