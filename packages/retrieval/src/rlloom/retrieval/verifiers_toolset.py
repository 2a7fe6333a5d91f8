"""rlloom.retrieval as a verifiers tool server (verifiers >= 0.4, `import verifiers.v1 as vf`).

verifiers gives a model tools through MCP servers: a `vf.Toolset` subclass whose `@vf.tool` methods become tools,
launched by verifiers as `python -m <its module>` with its config as JSON. `RetrievalToolset` serves one tool,
`retrieval_search(query, k)`, over an rlloom index folder (`index`), a JSONL corpus indexed with BM25 in memory
when the server starts (`corpus`; small corpora), or a running rlloom / Search-R1 retrieval server
(`server_url`). Passages come back as Search-R1 formats them ("Doc 1(Title: ...) text"), so a policy trained
with rlloom's SearchEnv sees the same observations. Return it from `Task.toolsets` (one server per rollout) or,
for a large index loaded once, from `Taskset.toolsets` (one shared server).

This module imports verifiers, the `verifiers` extra: `pip install "rlloom-retrieval[verifiers]"`.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any, Literal

import verifiers.v1 as vf
from pydantic import Field, model_validator

from rlloom.retrieval.client import AsyncRetrievalClient
from rlloom.retrieval.index import build_index, load_index
from rlloom.retrieval.types import Hit

DOC_TEMPLATE = "Doc {rank}(Title: {title}) {text}\n"


class RetrievalToolsetConfig(vf.ToolsetConfig):  # type: ignore[misc]  # verifiers ships no type hints
    """Where the passages come from (exactly one of `index`, `corpus`, `server_url`) and how many to return."""

    index: str | None = Field(default=None, description="An rlloom index folder (`rlloom-retrieval build-index`).")
    corpus: str | None = Field(
        default=None, description="A Search-R1 or BEIR JSONL corpus, BM25-indexed when the server starts."
    )
    server_url: str | None = Field(default=None, description="A running rlloom or Search-R1 retrieval server.")
    server_api: Literal["native", "search-r1"] = Field(
        default="native", description="The server's API: rlloom's /search or Search-R1's /retrieve."
    )
    top_k: int = Field(default=3, ge=1, le=100, description="Passages per search when the model gives no k.")
    max_k: int = Field(default=10, ge=1, le=100, description="The most passages a model may ask for.")

    @model_validator(mode="after")
    def _one_source(self) -> RetrievalToolsetConfig:
        sources = [name for name in ("index", "corpus", "server_url") if getattr(self, name)]
        if self.url is None and len(sources) != 1:  # `url` = an MCP server already running elsewhere
            given = ", ".join(sources) or "none"
            raise ValueError(
                f"RetrievalToolsetConfig needs exactly one of index, corpus or server_url (given: {given})"
            )
        return self


def format_passages(hits: list[Hit]) -> str:
    """Search-R1's `_passages2string`: the title is the first line of `contents` (quoted), the text the rest."""
    parts = []
    for rank, hit in enumerate(hits, start=1):
        title, _, text = hit.contents.partition("\n")
        parts.append(DOC_TEMPLATE.format(rank=rank, title=title, text=text))
    return "".join(parts)


class RetrievalToolset(vf.Toolset[RetrievalToolsetConfig]):  # type: ignore[misc]
    """One tool, `retrieval_search`, over an rlloom retriever loaded once per server process."""

    TOOL_PREFIX = "retrieval"

    async def setup(self) -> None:
        config: RetrievalToolsetConfig = self.config
        self._retriever: Any
        if config.server_url:
            client = AsyncRetrievalClient(config.server_url, api=config.server_api)
            self._exit_stack.push_async_callback(client.aclose)
            self._retriever = client
        elif config.corpus:
            folder = tempfile.TemporaryDirectory(prefix="rlloom-vf-index-")
            self._exit_stack.callback(folder.cleanup)
            path = await asyncio.to_thread(build_index, config.corpus, f"{folder.name}/bm25", "bm25")
            self._retriever = load_index(path)
        else:
            self._retriever = load_index(str(config.index))

    @vf.tool  # type: ignore[untyped-decorator]
    async def search(self, query: str, k: int | None = None) -> str:
        """Search the corpus for passages about `query` and return the best ones, numbered, each with its title.
        `k` is how many passages to return (default 3)."""
        config: RetrievalToolsetConfig = self.config
        k = config.top_k if k is None else k
        if not 1 <= k <= config.max_k:
            return f"Error: k must be between 1 and {config.max_k}, got {k}"
        if not query.strip():
            return "Error: the query is empty; give the words to search for"
        if isinstance(self._retriever, AsyncRetrievalClient):
            results = await self._retriever.search([query], k)
        else:
            results = await asyncio.to_thread(self._retriever.search, [query], k)
        return format_passages(results[0]) or "No passages found."


if __name__ == "__main__":  # how verifiers launches a tool server
    RetrievalToolset.run()
