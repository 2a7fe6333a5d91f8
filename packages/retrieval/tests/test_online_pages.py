"""Search-R1's Google full-page mode (`google_search_server.py` without --snippet_only) against a local stand-in
for the web: one HTTP server on 127.0.0.1 answers Google's customsearch/v1 JSON and serves the result pages, among
them a slow one, a missing one, a huge one, a PDF and a page that does not hold the snippet. The expected passages
are written out by hand from the pages below."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from rlloom.retrieval.online import GoogleSearch, GoogleSearchConfig
from rlloom.retrieval.pages import collect_context, html_links, page_text
from rlloom.retrieval.server import ServerLimits

PART_A = "Shirley Temple Black was an American actress and diplomat"
PART_B = "she served as United States Ambassador to Ghana in 1974"
PART_C = "Kiss and Tell is a 1945 American comedy film"
PAGES: dict[str, tuple[str, bytes]] = {
    "/wiki/Shirley_Temple": (
        "text/html; charset=iso-8859-1",
        (
            "<html><head><title>x</title><script>var p = '<p>no</p>';</script></head><body>"
            f"<div>menu</div><p>Intro line.</p><p>{PART_A}, born in 1928 &amp; raised in Santa Monica.</p>"
            "<p>Caf\u00e9 society knew her.</p></body></html>"
        ).encode("iso-8859-1"),
    ),
    "/news/story.html": (
        "text/html",
        f"<p>{PART_C}.</p><p>Unrelated.</p><p>Later {PART_B} and then to Czechoslovakia.".encode(),
    ),
    "/huge.html": ("text/html", f"<p>{PART_A} on the big page.</p>".encode() + b"<p>filler</p>" * 500_000),
    "/nomatch.htm": ("text/html", b"<p>This page is about something else entirely.</p>"),
    "/paper.pdf": ("application/pdf", b"%PDF-1.4"),
    "/file": ("application/pdf", b"%PDF-1.4"),
}
SLOW = "/slow.html"


def _item(path: str, title: str, snippet: str, **extra: Any) -> dict[str, Any]:
    return {"title": title, "link": path, "snippet": snippet, **extra}


ITEMS = [
    _item("/wiki/Shirley_Temple", "Shirley Temple - Wikipedia", f"{PART_A} ... short ... nothing more here"),
    _item("/news/story.html", "Story", f"{PART_C} ... {PART_B}"),
    _item("/paper.pdf", "A paper", f"{PART_A} in a paper"),
    _item("/file", "A file", f"{PART_A} in a file", mime="application/pdf"),
    _item(SLOW, "Slow page", "The slow page would have said a lot of words here"),
    _item("/gone.html", "Gone page", "The missing page used to say a lot of words here"),
    _item("/huge.html", "Huge page", f"... {PART_A} ..."),
    _item("/nomatch.htm", "No match", "Its snippet has more than five words in it"),
]


class Web:
    """customsearch/v1 at /customsearch/v1 and the pages above, on one local port."""

    def __init__(self) -> None:
        self.fetched: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/customsearch/v1":
                    query = parse_qs(url.query)["q"][0]
                    items = [{**item, "link": outer.base + item["link"]} for item in ITEMS]
                    self._send(200, "application/json", json.dumps({"items": items, "q": query}).encode())
                    return
                outer.fetched.append(url.path)
                if url.path == SLOW:
                    time.sleep(3)
                    self._send(200, "text/html", f"<p>{PART_A}</p>".encode())
                elif url.path in PAGES:
                    self._send(200, *PAGES[url.path])
                else:
                    self._send(404, "text/html", b"<p>Not found, with many words in this paragraph here.</p>")

            def _send(self, status: int, kind: str, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client stopped reading (size limit, timeout)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def web(monkeypatch: pytest.MonkeyPatch) -> Iterator[Web]:
    monkeypatch.setenv("GOOGLE_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_CSE_ID", "test-cx")
    stand_in = Web()
    yield stand_in
    stand_in.close()


def _google(web: Web, **options: Any) -> GoogleSearch:
    config = GoogleSearchConfig(
        base_url=f"{web.base}/customsearch/v1", max_qps=1000, full_page=True, page_timeout_s=0.5,
        max_page_bytes=64 * 1024, **options,
    )  # fmt: skip
    return GoogleSearch(config)


def test_search_r1s_defaults() -> None:
    config = GoogleSearchConfig()
    assert (config.full_page, config.page_timeout_s, config.page_concurrency) == (False, 5.0, 8)
    assert html_links([{"link": "https://a.org/x"}, {"link": "https://a.org/x.pdf"}, {"link": "https://a.org/y.htm"},
                       {"link": "https://a.org/z.html", "mime": "text/html"}, {"link": "ftp://a.org/w"}]) == [
        "https://a.org/x", "https://a.org/y.htm"]  # fmt: skip


def test_page_text_and_collect_context_by_hand() -> None:
    html = "<p>One &amp; two.</p><div>skip</div><p>Three<b> four</b><p>Five"
    assert page_text(html) == "One & two.\nThree four\nFive"
    doc = "First paragraph here.\nThe quick brown fox jumps over the lazy dog today.\nLast one."
    assert collect_context("quick brown fox jumps over the lazy ... too short", doc) == (
        "The quick brown fox jumps over the lazy dog today."
    )
    assert collect_context("nothing of this is in the page", doc) == ""


def test_full_pages_replace_snippets_and_failures_keep_theirs(web: Web) -> None:
    google = _google(web)
    started = time.monotonic()
    hits = google.search(["shirley temple"], 10)[0]
    took = time.monotonic() - started
    google.close()
    by_link = {h.doc_id.removeprefix(web.base): h for h in hits}
    # the PDF link and the `mime` result are left out, as Search-R1 does; the rest keep Google's order
    assert list(by_link) == ["/wiki/Shirley_Temple", "/news/story.html", SLOW, "/gone.html", "/huge.html",
                             "/nomatch.htm"]  # fmt: skip
    assert "/paper.pdf" not in web.fetched and "/file" not in web.fetched
    # the page's paragraph holding the snippet's sentence, decoded from iso-8859-1, entities resolved
    assert by_link["/wiki/Shirley_Temple"].text == f"{PART_A}, born in 1928 & raised in Santa Monica."
    # two snippet parts, two paragraphs, in the snippet's order; the last <p> is never closed
    assert by_link["/news/story.html"].text == f"{PART_C}.\nLater {PART_B} and then to Czechoslovakia."
    assert by_link["/huge.html"].text == f"{PART_A} on the big page."  # read up to max_page_bytes only
    # the slow page (3 s > 0.5 s), the 404 and the page without the snippet: the snippet's parts of > 5 words
    assert by_link[SLOW].text == "The slow page would have said a lot of words here"
    assert by_link["/gone.html"].text == "The missing page used to say a lot of words here"
    assert by_link["/nomatch.htm"].text == "Its snippet has more than five words in it"
    assert (
        by_link["/wiki/Shirley_Temple"].contents
        == f'"Shirley Temple - Wikipedia"\n{PART_A}, born in 1928 & raised in Santa Monica.'
    )
    assert took < 2.5  # the slow page did not hold the search for its 3 s
    stats = google.stats()
    assert (stats["pages_fetched"], stats["pages_failed"], stats["pages_cut"]) == (4, 2, 1)
    failures = sorted(stats["recent_page_failures"])
    assert failures[0] == f"{web.base}/gone.html: answered 404"
    assert failures[1].startswith(f"{web.base}{SLOW}: ReadTimeout")


def test_served_full_page_mode_reports_failed_pages(web: Web, start_server: Any) -> None:
    """`serve --online google --opt full_page=true`: Search-R1's /retrieve answers, /stats lists the failures."""
    google = _google(web)
    with start_server(google, ServerLimits(freeze_gc=False)) as server:
        body = httpx.post(f"{server.url}/retrieve", json={"queries": ["shirley temple"], "topk": 3}).json()
        stats = httpx.get(f"{server.url}/stats").json()
    google.close()
    assert [d["contents"].partition("\n")[2] for d in body["result"][0]] == [
        f"{PART_A}, born in 1928 & raised in Santa Monica.",
        f"{PART_C}.\nLater {PART_B} and then to Czechoslovakia.",
        "The slow page would have said a lot of words here",
    ]
    assert stats["backend"]["pages_failed"] == 2 and stats["backend"]["requests_sent"] == 1
    assert any("answered 404" in line for line in stats["backend"]["recent_page_failures"])


def test_full_page_results_are_cached(web: Web) -> None:
    google = _google(web)
    first = google.search(["shirley temple"], 3)
    fetched = len(web.fetched)
    assert google.search(["shirley temple"], 3) == first and len(web.fetched) == fetched
    google.close()
