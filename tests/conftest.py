"""Shared test fixtures."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Small tensors: one intra-op thread. Two threads gain nothing here, and when the cores are
    shared with another busy process, OpenMP's waiting makes each tiny op up to ~70x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
