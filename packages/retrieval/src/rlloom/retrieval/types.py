"""The one interface every retriever implements (local index, hybrid, HTTP client), and its result type."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict


class Hit(BaseModel):
    """One retrieved passage: its corpus id, the backend's score (higher is better), text and optional title."""

    model_config = ConfigDict(frozen=True)

    doc_id: str
    score: float
    text: str
    title: str | None = None

    @property
    def contents(self) -> str:
        """The passage in Search-R1's `contents` form: the title in quotes on the first line, then the text."""
        return f'"{self.title}"\n{self.text}' if self.title is not None else self.text


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers a batch of queries with the top-k passages of each, best first."""

    def search(self, queries: list[str], k: int) -> list[list[Hit]]: ...


class IndexLoadError(RuntimeError):
    """An index folder is missing, corrupt, or was built for something else; the message says how to fix it."""


class CorpusFormatError(ValueError):
    """A corpus line cannot be read as Search-R1 JSONL (`id`, `contents`) or BEIR JSONL (`_id`, `title`, `text`)."""


class EncoderMismatchError(ValueError):
    """The model folder given at load is not the encoder a dense index was built with."""
