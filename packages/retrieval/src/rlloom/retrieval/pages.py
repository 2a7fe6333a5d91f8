"""Search-R1's Google full-page mode (`google_search_server.py` without `--snippet_only`): download each result's
page and answer with the page's paragraphs that hold the snippet's sentences, instead of the snippet.

As Search-R1 does it: only links that look like HTML pages are fetched (no `mime` in the result, and an extension
of "", .html, .htm or .shtml; other results are left out), 8 at a time, each within 5 s in all; the page text is its
`<p>` elements' text joined by newlines, and a result's passage is every paragraph that contains one of the
snippet's '...'-parts of more than 5 words (`collect_context`). Unlike Search-R1, which answers "No snippet
available." for a page it could not read (and reads error pages as pages), a page that fails (connection error,
timeout, an answer other than 2xx, not HTML) or holds none of the snippet's parts gives the snippet itself; a
failure is logged and counted in `PageStats` (the server's /stats shows it). A page is read up to `max_bytes`
(the rest is not downloaded) so one huge page cannot hold the process's memory.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import httpx

__all__ = ["PageFetcher", "PageStats", "collect_context", "html_links", "page_text"]

logger = logging.getLogger("rlloom.retrieval.pages")

PAGE_EXTENSIONS = ("", ".html", ".htm", ".shtml")  # Search-R1's filter_links
USER_AGENT = "Mozilla/5.0 (compatible; rlloom-retrieval; +https://github.com/)"
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def html_links(items: Iterable[dict[str, Any]]) -> list[str]:
    """The result links Search-R1 fetches: no `mime` (Google marks PDFs and other files with it), and a path
    extension of "", .html, .htm or .shtml."""
    links = []
    for item in items:
        link = item.get("link")
        if "mime" in item or not isinstance(link, str) or not link.startswith(("http://", "https://")):
            continue
        if os.path.splitext(link)[1] in PAGE_EXTENSIONS:
            links.append(link)
    return links


class _Paragraphs(HTMLParser):
    """The text of every `<p>` element (a `<p>` inside an open one starts the next, as HTML parsers end it)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "p":
            self._close()
            self._open = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self._close()

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)

    def _close(self) -> None:
        if self._open is not None:
            self.paragraphs.append("".join(self._open))
            self._open = None


def page_text(html: str) -> str:
    """Search-R1's page text: the `<p>` elements' text joined by newlines."""
    parser = _Paragraphs()
    parser.feed(html)
    parser.close()
    parser._close()  # a page that ends inside a <p>
    return "\n".join(parser.paragraphs)


def collect_context(snippet: str, doc: str) -> str:
    """Search-R1's `collect_context`: each paragraph of `doc` that contains one of the snippet's '...'-parts of more
    than 5 words, once, in the snippet's order."""
    parts = [s.strip() for s in snippet.split("...") if len(s.strip().split()) > 5]
    flat = doc.replace("\n", " ")
    paragraphs: list[str] = []
    for part in parts:
        pos = flat.find(part)
        if pos == -1:
            continue
        start = pos
        while start > 0 and doc[start] != "\n":
            start -= 1
        end = pos + len(part)
        while end < len(doc) and doc[end] != "\n":
            end += 1
        paragraph = doc[start:end].strip()
        if paragraph not in paragraphs:
            paragraphs.append(paragraph)
    return "\n".join(paragraphs)


def _decode(raw: bytes, content_type: str) -> str:
    """The page's charset from its Content-Type, else its <meta charset>, else UTF-8; undecodable bytes dropped."""
    found = re.search(r"charset=([\w.:-]+)", content_type)
    meta = _CHARSET.search(raw[:4096])
    for name in (found.group(1) if found else None, meta.group(1).decode("ascii") if meta else None):
        if name:
            try:
                return raw.decode(name, errors="ignore")
            except LookupError:
                continue
    return raw.decode("utf-8", errors="ignore")


@dataclass
class PageStats:
    """What the page fetches did: pages read, pages failed (their snippet used), pages cut at max_bytes."""

    fetched: int = 0
    failed: int = 0
    cut: int = 0
    recent_failures: deque[str] = field(default_factory=lambda: deque(maxlen=20))

    def as_dict(self) -> dict[str, Any]:
        return {
            "pages_fetched": self.fetched,
            "pages_failed": self.failed,
            "pages_cut": self.cut,
            "recent_page_failures": list(self.recent_failures),
        }


class PageFetcher:
    """Downloads pages `concurrency` at a time, each within `timeout_s` in all and up to `max_bytes`."""

    def __init__(self, timeout_s: float = 5.0, max_bytes: int = 2 * 1024 * 1024, concurrency: int = 8) -> None:
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self.stats = PageStats()
        self._lock = threading.Lock()
        self._http = httpx.Client(
            timeout=timeout_s,
            follow_redirects=True,
            headers={"User-Agent": USER_AGENT},
            limits=httpx.Limits(max_connections=concurrency),
        )
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="page-fetch")

    def texts(self, links: list[str]) -> dict[str, str | None]:
        """Each link's page text (`page_text`), or None when the page failed (logged and counted)."""
        unique = list(dict.fromkeys(links))
        return dict(zip(unique, self._pool.map(self._one, unique), strict=True))

    def _one(self, link: str) -> str | None:
        try:
            html = self._download(link)
        except Exception as err:  # any failure of one page: the result keeps its snippet
            reason = err.args[0] if isinstance(err, _PageError) else f"{type(err).__name__}: {err}"
            with self._lock:
                self.stats.failed += 1
                self.stats.recent_failures.append(f"{link}: {reason}")
            logger.warning("page %s not read (%s); its snippet is used", link, reason)
            return None
        with self._lock:
            self.stats.fetched += 1
        return page_text(html)

    def _download(self, link: str) -> str:
        deadline = time.monotonic() + self.timeout_s
        with self._http.stream("GET", link) as response:
            if not 200 <= response.status_code < 300:
                raise _PageError(f"answered {response.status_code}")
            kind = response.headers.get("content-type", "")
            if kind and not any(t in kind for t in ("html", "text/plain", "xml")):
                raise _PageError(f"not an HTML page ({kind.split(';')[0]})")
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                if time.monotonic() > deadline:
                    raise _PageError(f"took more than {self.timeout_s:g} s")
                chunks.append(chunk)
                size += len(chunk)
                if size >= self.max_bytes:
                    with self._lock:
                        self.stats.cut += 1
                    break
            raw = b"".join(chunks)[: self.max_bytes]
            return _decode(raw, kind)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()


class _PageError(Exception):
    """A page that could not be used; the message says why."""
