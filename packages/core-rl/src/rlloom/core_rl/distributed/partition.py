"""Which rows of a batch each data-parallel rank works on.

Rows are dealt by token count (longest first, each to the rank with the fewest tokens so far), so ranks finish
their forwards at about the same time, and a batch need not divide the number of ranks: 5 rows on 2 ranks is
3 + 2, 2 rows on 3 ranks leaves one rank without rows (it still joins every collective, see `ranks.py`).
"""

from __future__ import annotations

from collections.abc import Sequence


def balance_rows(token_counts: Sequence[int], parts: int) -> list[list[int]]:
    """Split row indices into `parts` lists of about equal token totals (greedy LPT, deterministic).

    Ties go to the lower rank, so every rank computes the same split from the same batch without talking.
    Each list is in ascending row order.
    """
    if parts < 1:
        raise ValueError(f"balance_rows: parts must be >= 1, got {parts}")
    if any(count < 0 for count in token_counts):
        raise ValueError("balance_rows: token counts must be non-negative")
    loads = [0] * parts
    assigned: list[list[int]] = [[] for _ in range(parts)]
    order = sorted(range(len(token_counts)), key=lambda row: (-token_counts[row], row))
    for row in order:
        target = min(range(parts), key=lambda part: (loads[part], len(assigned[part]), part))
        assigned[target].append(row)
        loads[target] += token_counts[row]
    return [sorted(rows) for rows in assigned]


__all__ = ["balance_rows"]
