"""Fixtures shared by this app's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run a fixed-seed learning test on one intra-op thread, then restore the count.

    Its recorded figures then do not depend on how many cores the machine has (reductions split over threads
    round differently), and on a loaded machine the tiny models' small kernels do not fight other jobs for cores.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
