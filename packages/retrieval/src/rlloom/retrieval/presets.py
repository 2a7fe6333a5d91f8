"""Named index presets: the settings of Search-R1's two retrievers, so an index matches them without a page of
`--opt`s.

- `bm25-pyserini`: BM25 as pyserini/Anserini runs it (Search-R1's `bm25` retriever is a pyserini
  `LuceneSearcher`): k1 0.9, b 0.4, Lucene's BM25 formula, Anserini's default English analyzer approximated as
  lowercase, single-character tokens kept, Lucene's 33 English stopwords (bm25s's `english` list is that set),
  and the original Porter stemmer (Lucene's `PorterStemFilter`; PyStemmer `porter`, not Porter2's `english`).
  What stays different: Lucene's UAX#29 tokenizer and possessive filter, so scores are close, not identical.
- `e5`: intfloat/e5-base-v2 as Search-R1's `retrieval_server.py` encodes with it: `query: ` / `passage: `
  prefixes, mean pooling over the attention mask, L2 normalisation, 256 tokens. The model folder is still
  yours to give (`model=...`): nothing is downloaded.

A preset fixes the backend and fills in options; options given alongside it win.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Preset(NamedTuple):
    backend: str
    options: dict[str, Any]
    about: str


PRESETS: dict[str, Preset] = {
    "bm25-pyserini": Preset(
        "bm25",
        {
            "k1": 0.9,
            "b": 0.4,
            "method": "lucene",
            "lowercase": True,
            "stopwords": "english",
            "stemmer": "porter",
            "token_pattern": r"(?u)\b\w+\b",
        },
        "BM25 as pyserini runs it (Search-R1's BM25): k1 0.9, b 0.4, Porter stemming, Lucene's English stopwords",
    ),
    "e5": Preset(
        "dense",
        {
            "query_prefix": "query: ",
            "passage_prefix": "passage: ",
            "pooling": "mean",
            "normalize": True,
            "max_length": 256,
        },
        "e5-base-v2 as Search-R1 encodes: 'query: '/'passage: ' prefixes, mean pooling, 256 tokens (give model=DIR)",
    ),
}


def apply_preset(name: str, backend: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(backend, options) for a preset: its backend, its options overridden by `options`."""
    preset = PRESETS.get(name)
    if preset is None:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    if backend is not None and backend != preset.backend:
        raise ValueError(
            f"preset {name!r} builds a {preset.backend} index, but backend {backend!r} was asked for; drop the "
            "backend or the preset"
        )
    return preset.backend, {**preset.options, **options}
