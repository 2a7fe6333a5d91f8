"""Reading structure out of a model's text: XML-style tags (`<think>`, `<search>`, `<answer>`) and final answers.

Parsing is deliberately forgiving about whitespace (`< answer >`, newlines inside tags) because small models
rarely format perfectly, but it *reports* every deviation in `ParsedTags.format_ok` / `problems`, so a format
reward can be computed from the same parse the environment acted on. Search-R1's action rule (the first
`<search>` or `<answer>` block wins) is `first_action`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

AnswerExtractor = Callable[[str], str | None]
"""Hook that pulls the final answer out of a response text (None when there is none)."""


def _tag_pattern(tag: str) -> re.Pattern[str]:
    name = re.escape(tag)
    return re.compile(rf"<\s*{name}\s*>(.*?)<\s*/\s*{name}\s*>", re.DOTALL | re.IGNORECASE)


def _open_close_patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    name = re.escape(tag)
    return (
        re.compile(rf"<\s*{name}\s*>", re.IGNORECASE),
        re.compile(rf"<\s*/\s*{name}\s*>", re.IGNORECASE),
    )


@dataclass(slots=True)
class TagBlock:
    """One `<tag>content</tag>` occurrence; `content` is stripped, `start`/`end` index the source text."""

    tag: str
    content: str
    start: int
    end: int


@dataclass(slots=True)
class ParsedTags:
    """All tag blocks found in a text, in order, plus whether the text was well formed."""

    blocks: list[TagBlock] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def format_ok(self) -> bool:
        """True when every opened tag was closed, nothing was nested, and there was no stray text issue."""
        return not self.problems

    def all(self, tag: str) -> list[str]:
        """Contents of every `tag` block, in order."""
        return [b.content for b in self.blocks if b.tag == tag]

    def last(self, tag: str) -> str | None:
        """Content of the last `tag` block, or None."""
        found = self.all(tag)
        return found[-1] if found else None

    def first(self, tag: str) -> str | None:
        found = self.all(tag)
        return found[0] if found else None


class XMLParser:
    """Finds `<tag>...</tag>` blocks for a fixed set of tags, tolerant of whitespace and case in the tags.

    `problems` lists: unclosed or unopened tags, nested blocks, and empty blocks for tags in `non_empty`.
    """

    def __init__(self, tags: Sequence[str], *, non_empty: Sequence[str] = ()) -> None:
        if not tags:
            raise ValueError("XMLParser: `tags` is empty; name at least one tag such as 'answer'")
        for tag in tags:
            if not re.fullmatch(r"[A-Za-z_][\w\-]*", tag):
                raise ValueError(f"XMLParser: tag {tag!r} is not a valid tag name (letters, digits, _ and -)")
        self.tags = list(dict.fromkeys(tags))
        self.non_empty = set(non_empty)
        self._block = {t: _tag_pattern(t) for t in self.tags}
        self._marks = {t: _open_close_patterns(t) for t in self.tags}

    def parse(self, text: str) -> ParsedTags:
        """Every block of every known tag, ordered by position, and the format problems found."""
        parsed = ParsedTags()
        for tag in self.tags:
            for m in self._block[tag].finditer(text):
                parsed.blocks.append(TagBlock(tag, m.group(1).strip(), m.start(), m.end()))
            opener, closer = self._marks[tag]
            n_open, n_close = len(opener.findall(text)), len(closer.findall(text))
            if n_open != n_close:
                parsed.problems.append(f"<{tag}> opened {n_open} times but closed {n_close} times")
        parsed.blocks.sort(key=lambda b: b.start)
        for prev, cur in zip(parsed.blocks, parsed.blocks[1:], strict=False):
            if cur.start < prev.end:
                parsed.problems.append(f"<{cur.tag}> is nested inside <{prev.tag}>")
        for block in parsed.blocks:
            if block.tag in self.non_empty and not block.content:
                parsed.problems.append(f"<{block.tag}> is empty")
        return parsed


_FIRST_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def first_action(text: str, tags: Sequence[str] = ("search", "answer")) -> tuple[str, str] | None:
    """Search-R1's action rule: the first `<search>`/`<answer>` block (exact tags), as (tag, stripped content).

    With other tag names (a configured SearchEnv) the same rule applies to those names.
    """
    if tuple(tags) == ("search", "answer"):
        m = _FIRST_ACTION.search(text)
    else:
        alternatives = "|".join(re.escape(t) for t in tags)
        m = re.search(rf"<({alternatives})>(.*?)</\1>", text, re.DOTALL)
    if m is None:
        return None
    return m.group(1), m.group(2).strip()


def last_tag_content(tag: str) -> AnswerExtractor:
    """An answer extractor returning the stripped content of the last `<tag>` block (whitespace tolerant)."""
    pattern = _tag_pattern(tag)

    def extract(text: str) -> str | None:
        found = pattern.findall(text)
        return found[-1].strip() if found else None

    extract.__name__ = f"last_{tag}"
    return extract


extract_answer: AnswerExtractor = last_tag_content("answer")
"""The default answer hook: the last `<answer>...</answer>` block."""
