"""rlloom.retrieval: bM25, dense (faiss) and Lucene retrieval backends, index building, a FastAPI server, an httpx client and retrieval eval."""

from rlloom.retrieval.__about__ import __version__

__all__ = ["__version__"]
