"""The prompt stream: row files, the stateful loader, samplers, online prompt filtering, user code and supervised
(ptx) rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.data.loader import PromptLoader as PromptLoader
    from rlloom.core_rl.data.loader import ground_truth as ground_truth
    from rlloom.core_rl.data.loader import rows_that_fit as rows_that_fit
    from rlloom.core_rl.data.rows import PARQUET_HINT as PARQUET_HINT
    from rlloom.core_rl.data.rows import DataError as DataError
    from rlloom.core_rl.data.rows import atomic_output as atomic_output
    from rlloom.core_rl.data.rows import open_text as open_text
    from rlloom.core_rl.data.rows import read_jsonl as read_jsonl
    from rlloom.core_rl.data.rows import read_parquet as read_parquet
    from rlloom.core_rl.data.rows import write_jsonl as write_jsonl
    from rlloom.core_rl.data.sources import check_row_sources as check_row_sources

_EXPORTS = {
    "check_row_sources": "sources",
    "PromptLoader": "loader",
    "ground_truth": "loader",
    "rows_that_fit": "loader",
    "PARQUET_HINT": "rows",
    "DataError": "rows",
    "atomic_output": "rows",
    "open_text": "rows",
    "read_jsonl": "rows",
    "read_parquet": "rows",
    "write_jsonl": "rows",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
