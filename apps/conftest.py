"""Fixtures shared by every app's tests (pytest finds this file above each app's tests folder)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Every test runs torch on one intra-op thread, then the count is restored.

    On a loaded CI machine, two threads per test fight the other jobs for the cores: a tiny VLM warm-up step took
    100-160 s there with two threads against 4-13 s with one, at the same load. The fixed-seed learning tests'
    recorded figures then also do not depend on the machine's core count (threads split reductions, which rounds
    differently).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
