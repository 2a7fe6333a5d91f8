"""What a backend returns before passages are attached: row numbers into the passage store and their scores."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
from numpy.typing import NDArray


class Ranking(NamedTuple):
    """One query's result: passage rows (int64) and scores (float32), best first, same length."""

    rows: NDArray[np.int64]
    scores: NDArray[np.float32]


EMPTY = Ranking(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))


class RankingBackend(Protocol):
    """A loaded index of one kind (bm25, dense, lucene, hybrid) ranking rows of a shared passage store."""

    doc_count: int

    def rank(self, queries: list[str], k: int) -> list[Ranking]: ...
