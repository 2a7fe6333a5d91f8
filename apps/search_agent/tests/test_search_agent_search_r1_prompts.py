"""`search-agent eval --method direct|rag` send Search-R1's own baseline prompts, character for character.

The expected prompts come from Search-R1's code itself, copied below (Apache-2.0, github.com/PeterGriffinJin/
Search-R1, `scripts/data_process/nq.py` and `nq_rag.py`: `make_prefix(dp, template_type="base")` and
`format_reference`), run on the same question and the same retrieved passages as rlloom's evaluation.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rlloom_apps.search_agent.data import prepare
from rlloom_apps.search_agent.evaluate import EvalSettings, evaluate

from rlloom.core_rl import char_tokenizer
from rlloom.core_rl.contracts import Completion, GenerationRequest
from rlloom.retrieval import build_index, load_index


# ---- copied from Search-R1 (scripts/data_process/nq.py, template_type 'base') ----
def search_r1_direct_prefix(dp: dict[str, Any]) -> str:
    question = dp["question"]
    prefix = f"""Answer the given question. \
You should first have a reasoning process in mind and then provides the answer. \
Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, for example <answer> Beijing </answer>. \
Question: {question}\n"""  # noqa: E501
    return prefix


# ---- copied from Search-R1 (scripts/data_process/nq_rag.py, template_type 'base') ----
def search_r1_rag_prefix(dp: dict[str, Any]) -> str:
    question = dp["question"]
    context = dp["context"]
    prefix = f"""Answer the given question with some potentially useful context. \
You should analyze the question carefully, evaluate the given context (which may or may not be useful), and then generate an accurate and well-reasoned response. \
You should first have a reasoning process in mind and then provides the answer. \
Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, for example <answer> Beijing </answer>. \
Question: {question} Context: {context} \n"""  # noqa: E501
    return prefix


def search_r1_format_reference(retrieval_result: list[dict[str, str]]) -> str:
    format_reference = ""
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item["contents"]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        format_reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
    return format_reference


# ---- end of copied code ----

PASSAGES = [
    ("Paris", "Paris is the capital of France."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Rome", "Rome is the capital of Italy."),
]


class RecordingEngine:
    """Answers every request with a fixed answer and keeps the user message it was sent."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.eos_token_ids = {int(tokenizer.eos_token_id)}
        self.prompts: list[str] = []

    def generate(self, requests: Any) -> Any:
        raise NotImplementedError("the agent loop only calls agenerate")

    def update_weights(self, named_tensors: Any) -> None:
        return None

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        assert request.prompt_ids is not None
        self.prompts.append(self.tok.decode(request.prompt_ids, skip_special_tokens=False))
        text = "<answer> Paris </answer>"
        ids = [*self.tok(text, add_special_tokens=False)["input_ids"], self.tok.eos_token_id]
        return [Completion(request.request_id, list(request.prompt_ids), ids, text, "stop", [0.0] * len(ids))]


def _setup(tmp_path: Path) -> tuple[list[dict[str, Any]], Any]:
    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": str(i), "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(PASSAGES))
    )
    build_index(tmp_path / "corpus.jsonl", tmp_path / "index", "bm25")
    (tmp_path / "raw.jsonl").write_text(json.dumps({"question": "what is the capital of france", "answer": ["Paris"]}))
    prepare("nq", tmp_path / "raw.jsonl", tmp_path / "nq.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "nq.jsonl").read_text().splitlines()]
    return rows, load_index(tmp_path / "index")


def _user_message(rendered: str, expected: str) -> str:
    """The user turn inside the chat-rendered prompt: the part from the expected text's first words on."""
    start = rendered.index(expected[:40])
    return rendered[start : start + len(expected)]


def test_direct_prompt_is_search_r1s(tmp_path: Path) -> None:
    rows, _ = _setup(tmp_path)
    tok = char_tokenizer()
    engine = RecordingEngine(tok)
    asyncio.run(evaluate(engine, tok, rows, "direct", EvalSettings(progress=False)))  # type: ignore[arg-type]
    # Search-R1's data prep appends "?" to a question that lacks one (nq.py: `if question[-1] != '?'`)
    expected = search_r1_direct_prefix({"question": "what is the capital of france?"})
    assert len(engine.prompts) == 1
    assert _user_message(engine.prompts[0], expected) == expected


def test_rag_prompt_is_search_r1s_with_its_passage_lines(tmp_path: Path) -> None:
    rows, retriever = _setup(tmp_path)
    tok = char_tokenizer()
    engine = RecordingEngine(tok)
    asyncio.run(evaluate(engine, tok, rows, "rag", EvalSettings(progress=False), retriever=retriever))  # type: ignore[arg-type]
    hits = retriever.search(["what is the capital of france?"], 3)[0]
    # wiki-18's `contents` is the quoted title, a newline, then the text
    contents = [{"contents": f'"{h.title}"\n{h.text}'} for h in hits]
    context = search_r1_format_reference(contents)
    assert context.startswith('Doc 1(Title: "Paris") Paris is the capital of France.\n')
    expected = search_r1_rag_prefix({"question": "what is the capital of france?", "context": context})
    assert len(engine.prompts) == 1
    assert _user_message(engine.prompts[0], expected) == expected
