"""`search-agent eval` and `infer`: the table's figures, each method's protocol, and the commands end to end.

The protocol tests use a scripted policy (it reads its context and writes what a competent agent would), so
every expected EM follows from a real BM25 index over three passages and is worked out by hand below. The
command tests run a randomly initialised character model through the real engine and check the written files
against each other and against an independent exact-match check.
"""

from __future__ import annotations

import asyncio
import json
import re
import string
from pathlib import Path
from typing import Any

import pytest
from rlloom_apps.search_agent.cli import main
from rlloom_apps.search_agent.data import prepare
from rlloom_apps.search_agent.evaluate import (
    EvalSettings,
    RowResult,
    evaluate,
    markdown_table,
    problems_report,
    row_question,
    source_scores,
)
from rlloom_apps.search_agent.infer import ask

from rlloom.core_rl.contracts import Completion, GenerationRequest
from rlloom.core_rl.tiny import char_tokenizer, save_tiny_model
from rlloom.retrieval import build_index, load_index

PASSAGES = [
    ("Paris", "Paris is the capital of France."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Rome", "Rome is the capital of Italy."),
]
NQ = [
    {"question": "what is the capital of france", "answer": ["Paris"]},
    {"question": "what is the capital of germany", "answer": ["Berlin", "Berlin, Germany"]},
]
HOTPOT = [{"question": "what is the capital of italy", "answer": "Rome"}]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval")
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": str(i), "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(PASSAGES))
    )
    build_index(root / "corpus.jsonl", root / "index", "bm25")
    paths = {"root": root, "index": root / "index"}
    for name, source, records in (("nq", "nq", NQ), ("hotpotqa", "hotpotqa", HOTPOT)):
        (root / f"{name}_raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        prepare(source, root / f"{name}_raw.jsonl", root / f"{name}.jsonl")
        paths[name] = root / f"{name}.jsonl"
    return paths


def rows_of(*paths: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines()]


class ScriptedAgent:
    """Plays a competent policy from its context, so retrieval, prompts and scoring decide every EM.

    With no passages in view it searches for the question (or, with `direct_answer`, answers it blind);
    with passages it answers with Doc 1's title.
    """

    def __init__(self, tokenizer: Any, direct_answer: str = "<answer> Paris </answer>") -> None:
        self.tok, self.direct_answer = tokenizer, direct_answer
        self.eos_token_ids = {int(tokenizer.eos_token_id)}
        self.prompts: list[str] = []

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        assert request.prompt_ids is not None and request.sampling.temperature == 0.0  # eval is greedy
        context = self.tok.decode(request.prompt_ids, skip_special_tokens=False)
        self.prompts.append(context)
        titles = re.findall(r'Doc 1\(Title: "?([^")]+)"?\)', context)
        question = context.rsplit("Question: ", 1)[1].split("?", 1)[0]
        if titles:
            text = f"<answer> {titles[-1]} </answer>"
        elif "<search>" in context.split("Question: ", 1)[1] or "Documents:" in context:
            text = "<answer> nowhere </answer>"
        elif "call a search engine" in context:
            text = f"<search> {question} </search>"
        else:
            text = self.direct_answer
        ids = [*self.tok(text, add_special_tokens=False)["input_ids"], self.tok.eos_token_id]
        return [Completion(request.request_id, list(request.prompt_ids), ids, text, "stop", [0.0] * len(ids))]

    def generate(self, requests: Any) -> Any:
        raise NotImplementedError("the agent loop only calls agenerate")

    def update_weights(self, named_tensors: Any) -> None:
        return None


def _em(prediction: str | None, golds: list[str]) -> float:
    """SQuAD normalisation written out again, independent of rlloom-rewards."""

    def norm(s: str) -> str:
        s = "".join(c for c in s.lower() if c not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    return float(prediction is not None and norm(prediction) in {norm(g) for g in golds})


def test_table_columns_follow_search_r1_and_average_over_sources() -> None:
    def r(source: str, em: float, searches: float = 0.0) -> RowResult:
        return RowResult(source, 0, "q", ["a"], "a", em, em, em, searches, 1.0, "stop", "")

    results = [
        r("nq", 1, 2),
        r("nq", 0, 1),
        r("nq", 1),
        r("hotpotqa", 0),
        r("hotpotqa", 0),
        r("zz", 1),
        r("triviaqa", 1),
    ]
    scores = source_scores(results)
    assert list(scores) == ["nq", "triviaqa", "hotpotqa", "zz"]  # the paper's order, unknown sources last
    assert scores["nq"]["em"] == pytest.approx(2 / 3) and scores["nq"]["n"] == 3.0
    assert scores["nq"]["searches"] == pytest.approx(1.0)
    table = markdown_table({"search": scores, "direct": {"nq": {"em": 0.5}}})
    lines = table.splitlines()
    assert lines[0] == "| Method | NQ | TriviaQA | HotpotQA | zz | Avg. |"
    # unweighted over sources, as in the paper: (2/3 + 1 + 0 + 1) / 4
    assert lines[2] == "| search | 0.667 | 1.000 | 0.000 | 1.000 | 0.667 |"
    assert lines[3] == "| direct | 0.500 | - | - | - | 0.500 |"


def test_row_question_reads_prepared_flat_and_legacy_rows(corpus: dict[str, Path]) -> None:
    prepared = rows_of(corpus["nq"])[0]
    assert row_question(prepared) == "what is the capital of france"
    legacy = {**prepared, "extra_info": {"index": 0}}  # rows prepared before extra_info.question existed
    assert row_question(legacy) == "what is the capital of france?"
    assert row_question({"question": "who?"}) == "who?"
    with pytest.raises(ValueError, match="extra_info.question"):
        row_question({"prompt": [{"role": "user", "content": "no question here"}]})


def test_each_method_follows_its_protocol_and_is_scored_by_em(corpus: dict[str, Path]) -> None:
    tok = char_tokenizer()
    rows = rows_of(corpus["nq"], corpus["hotpotqa"])
    retriever = load_index(corpus["index"])
    settings = EvalSettings(progress=False)
    results: dict[str, list[RowResult]] = {}
    engines: dict[str, ScriptedAgent] = {}
    for method in ("search", "rag", "direct"):
        engines[method] = ScriptedAgent(tok)
        found = asyncio.run(evaluate(engines[method], tok, rows, method, settings, retriever=retriever))  # type: ignore[arg-type]
        results[method] = found
        for r in found:
            assert r.em == _em(r.prediction, r.golds)
    # search: it searches the question, BM25 puts the right city first, it answers with that title: all correct
    assert [r.prediction for r in results["search"]] == ["Paris", "Berlin", "Rome"]
    assert [r.searches for r in results["search"]] == [1.0, 1.0, 1.0]
    assert [r.turns for r in results["search"]] == [2.0, 2.0, 2.0]
    assert "<information>" in results["search"][0].response and 'Doc 1(Title: "Paris")' in results["search"][0].response
    # rag: one turn, the top-3 passages of the question already in the prompt (no search)
    assert [r.prediction for r in results["rag"]] == ["Paris", "Berlin", "Rome"]
    assert [(r.searches, r.turns) for r in results["rag"]] == [(0.0, 1.0)] * 3
    rag_prompt = engines["rag"].prompts[0]
    assert all(f'"{title}"' in rag_prompt for title, _ in PASSAGES) and "call a search engine" not in rag_prompt
    # direct: no retrieval at all; the blind answer is right for France only
    assert [r.em for r in results["direct"]] == [1.0, 0.0, 0.0]
    assert not any("Doc 1" in p for p in engines["direct"].prompts)
    scores = {m: source_scores(found) for m, found in results.items()}
    assert scores["direct"]["nq"]["em"] == 0.5 and scores["direct"]["hotpotqa"]["em"] == 0.0
    assert markdown_table(scores).splitlines()[2:] == [
        "| search | 1.000 | 1.000 | 1.000 |",
        "| rag | 1.000 | 1.000 | 1.000 |",
        "| direct | 0.500 | 0.000 | 0.250 |",
    ]


def test_fallback_to_text_scores_untagged_replies(corpus: dict[str, Path]) -> None:
    tok = char_tokenizer()
    rows = rows_of(corpus["nq"])
    for fallback, expected in ((False, [0.0, 0.0]), (True, [1.0, 0.0])):
        settings = EvalSettings(progress=False, fallback_to_text=fallback)
        found = asyncio.run(evaluate(ScriptedAgent(tok, direct_answer=" Paris."), tok, rows, "direct", settings))  # type: ignore[arg-type]
        assert [r.em for r in found] == expected
        assert [r.prediction for r in found] == (["Paris.", "Paris."] if fallback else [None, None])


def test_search_needs_a_retriever_and_golds_are_checked_first(corpus: dict[str, Path]) -> None:
    tok = char_tokenizer()
    bad = [{**rows_of(corpus["nq"])[0], "reward_model": {"ground_truth": {"target": []}}}]
    with pytest.raises(ValueError, match=r"row 0 \(nq\): bad reward_model.ground_truth"):
        asyncio.run(evaluate(ScriptedAgent(tok), tok, bad, "direct", EvalSettings(progress=False)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a retriever"):
        asyncio.run(evaluate(ScriptedAgent(tok), tok, rows_of(corpus["nq"]), "rag", EvalSettings(progress=False)))  # type: ignore[arg-type]


def test_ask_returns_each_answer_and_transcript(corpus: dict[str, Path]) -> None:
    tok = char_tokenizer()
    answered = asyncio.run(
        ask(ScriptedAgent(tok), tok, ["what is the capital of italy"], load_index(corpus["index"]), EvalSettings())  # type: ignore[arg-type]
    )
    assert [(a.answer, a.searches, a.turns, a.finish_reason) for a in answered] == [("Rome", 1, 2, "stop")]
    assert answered[0].transcript.startswith("<search> what is the capital of italy </search>")
    assert answered[0].transcript.rstrip().endswith("<answer> Rome </answer>")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    saved = save_tiny_model(tmp_path_factory.mktemp("model"), max_position_embeddings=2048)
    return {"model": saved.model, "tokenizer": saved.tokenizer}


def test_eval_command_writes_consistent_results(
    corpus: dict[str, Path], tiny_model: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    main(
        [
            "eval", "--data", str(corpus["nq"]), str(corpus["hotpotqa"]), "--index", str(corpus["index"]),
            "--model", str(tiny_model["model"]), "--tokenizer", str(tiny_model["tokenizer"]), "--device", "cpu",
            "--method", "search", "direct", "--limit", "1", "--max-turns", "2", "--max-tokens-per-turn", "12",
            "--max-obs-tokens", "40", "--max-total-tokens", "1500", "--out", str(out),
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    scores = json.loads((out / "results.json").read_text())
    assert list(scores) == ["search", "direct"] and list(scores["search"]) == ["nq", "hotpotqa"]
    assert (out / "table.md").read_text().strip() in printed
    for method in ("search", "direct"):
        preds = [json.loads(line) for line in (out / f"predictions_{method}.jsonl").read_text().splitlines()]
        assert [(p["data_source"], p["question"]) for p in preds] == [  # --limit 1: the first row of each source
            ("nq", "what is the capital of france"),
            ("hotpotqa", "what is the capital of italy"),
        ]
        for p in preds:
            assert p["em"] == _em(p["prediction"], p["golds"])
            assert 1 <= p["turns"] <= (2 if method == "search" else 1)
            assert scores[method][p["data_source"]]["em"] == p["em"]  # one row per source


def test_infer_command_prints_each_conversation(
    corpus: dict[str, Path], tiny_model: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "infer", "what is the capital of italy", "who wrote hamlet", "--index", str(corpus["index"]),
            "--model", str(tiny_model["model"]), "--tokenizer", str(tiny_model["tokenizer"]), "--device", "cpu",
            "--max-turns", "2", "--max-tokens-per-turn", "10", "--max-obs-tokens", "40",
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.count("=== ") == 2 and printed.count("--- answer: ") == 2
    assert "=== who wrote hamlet" in printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--data", "{nq}", "--method", "search"], "needs --index DIR or --retrieval-url URL"),
        (["eval", "--data", "{nq}", "--method", "direct"], "give exactly one of --model DIR"),
        (["eval", "--data", "{raw}", "--method", "direct", "--model", "{root}"], "is not a prepare-data row"),
        (["eval", "--data", "{nq}", "--index", "{root}/nope", "--model", "{root}"], "nope does not exist"),
        (["eval", "--data", "{nq}", "--index", "{root}", "--model", "{root}"], "not an rlloom index"),
        (
            ["eval", "--data", "{nq}", "--retrieval-url", "http://127.0.0.1:9", "--model", "{root}"],
            "--retrieval-url http://127.0.0.1:9 is unreachable",
        ),
        (
            ["eval", "--data", "{nq}", "--method", "direct", "--model", "{root}", "--top-k", "0"],
            "--top-k 0: input should be greater than or equal to 1",
        ),
        (["eval", "--data", "{nq}", "--method", "direct", "--model", "{root}", "--max-turns", "0"], "--max-turns 0:"),
        (["eval", "--data", "{nq}", "--method", "direct", "--model", "{root}", "--limit", "-1"], "--limit must be 0"),
        (["eval", "--data", "{nq}", "--method", "direct", "--engine-url", "http://x"], "needs --tokenizer DIR"),
        (
            # the arguments are .format()ted: {{ }} are the JSON object's braces
            [
                "eval",
                "--data",
                "{nq}",
                "--method",
                "direct",
                "--model",
                "{root}",
                "--chat-template-kwargs",
                '{{"tokenize": true}}',
            ],
            "--chat-template-kwargs {'tokenize': True}: tokenize cannot be set there",
        ),
        (
            ["eval", "--data", "{nq}", "--method", "direct", "--model", "{root}", "--n", "2"],
            "--n 2 needs --temperature > 0 (greedy decoding, --temperature 0, gives 2 identical",
        ),
        (
            ["eval", "--data", "{nq}", "--method", "direct", "--model", "{root}", "--n", "0", "--temperature", "1"],
            "--n 0: input should be greater than or equal to 1",
        ),
        (["infer", "q", "--model", "{root}", "--index", "{root}", "--n", "2"], "unrecognized arguments: --n"),
        (["infer", "q", "--model", "{root}"], "infer needs --index DIR or --retrieval-url URL"),
        (["infer", "q", " ", "--model", "{root}", "--index", "{root}/index"], "question 2 of 2 is empty"),
    ],
)
def test_bad_invocations_are_refused_by_name(
    corpus: dict[str, Path], args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = [a.format(nq=corpus["nq"], raw=corpus["root"] / "nq_raw.jsonl", root=corpus["root"]) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        main(filled)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "pydantic.dev" not in err


def test_an_overlong_prompt_is_a_scored_row_not_an_abort(corpus: dict[str, Path]) -> None:
    from rlloom_apps.search_agent.data import to_row

    tok = char_tokenizer()
    long_question = "what is the capital of italy " + "and of nowhere " * 150  # ~2,300 characters
    rows = [*rows_of(corpus["nq"]), to_row("hotpotqa", {"question": long_question, "answer": "Rome"}, 7, "test")]
    # the character tokenizer spends about a token per character: the short rows' prompts (~600) fit 1,500
    settings = EvalSettings(progress=False, max_total_tokens=1500)
    for method in ("rag", "search"):
        engine = ScriptedAgent(tok)
        found = asyncio.run(evaluate(engine, tok, rows, method, settings, retriever=load_index(corpus["index"])))  # type: ignore[arg-type]
        assert [r.finish_reason for r in found][2] == "overlong_prompt"
        assert [r.prediction for r in found] == ["Paris", "Berlin", None]  # the others still ran and scored
        assert (found[2].em, found[2].index, found[2].golds, found[2].data_source) == (0.0, 7, ["Rome"], "hotpotqa")
        assert not any("and of nowhere" in p for p in engine.prompts)  # never sent to the engine
        scores = source_scores(found)
        assert scores["hotpotqa"] == {**scores["hotpotqa"], "em": 0.0, "n": 1.0, "overlong": 1.0}
        assert scores["nq"]["overlong"] == 0.0 and scores["nq"]["em"] == 1.0


def test_each_method_is_written_as_it_finishes(
    corpus: dict[str, Path], tiny_model: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rlloom_apps.search_agent.evaluate as evaluate_module

    real = evaluate_module.evaluate

    async def rag_fails(engine: Any, tokenizer: Any, rows: Any, method: str, *args: Any, **kw: Any) -> Any:
        if method == "rag":
            raise RuntimeError("the retrieval server went away")
        return await real(engine, tokenizer, rows, method, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(evaluate_module, "evaluate", rag_fails)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="went away"):
        main(
            [
                "eval", "--data", str(corpus["nq"]), "--index", str(corpus["index"]), "--model",
                str(tiny_model["model"]), "--tokenizer", str(tiny_model["tokenizer"]), "--device", "cpu",
                "--method", "direct", "rag", "--max-tokens-per-turn", "4", "--out", str(out),
            ]
        )  # fmt: skip
    preds = [json.loads(line) for line in (out / "predictions_direct.jsonl").read_text().splitlines()]
    assert len(preds) == 2 and list(json.loads((out / "results.json").read_text())) == ["direct"]
    assert not (out / "predictions_rag.jsonl").exists()


def test_the_overlong_warning_gives_the_budget_the_model_capped(
    tiny_model: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the character model's context is 2,048 tokens (positions), so --max-total-tokens 4096 cannot be the limit;
    # a ~2,400-character question (about a token per character) does not fit
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"question": "capital of italy " + "and of nowhere " * 160, "answer": "Rome"}) + "\n")
    prepare("nq", raw, tmp_path / "rows.jsonl")
    main(
        [
            "eval", "--data", str(tmp_path / "rows.jsonl"), "--method", "direct", "--model", str(tiny_model["model"]),
            "--tokenizer", str(tiny_model["tokenizer"]), "--device", "cpu", "--max-tokens-per-turn", "4",
            "--max-total-tokens", "4096", "--out", str(tmp_path / "out"),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "1 of 1 prompts do not fit a conversation (2048 tokens: the model's context" in err
    (pred,) = [json.loads(line) for line in (tmp_path / "out" / "predictions_direct.jsonl").read_text().splitlines()]
    assert (pred["finish_reason"], pred["token_budget"]) == ("overlong_prompt", 2048)


def test_rows_without_a_prompt_are_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"data_source": "nq", "reward_model": {"ground_truth": {"target": ["x"]}}}) + "\n")
    with pytest.raises(SystemExit):  # the model folder does not exist: the row must be refused first
        main(["eval", "--data", str(rows), "--method", "direct", "--model", str(tmp_path / "no_model")])
    assert "row 0 has no prompt" in capsys.readouterr().err
    legacy = tmp_path / "legacy.jsonl"  # a prompt without 'Question: ...' and no extra_info.question
    legacy.write_text(
        json.dumps({"data_source": "nq", "prompt": [{"role": "user", "content": "hi"}],
                    "reward_model": {"ground_truth": {"target": ["x"]}}}) + "\n"
    )  # fmt: skip
    with pytest.raises(SystemExit):
        main(["eval", "--data", str(legacy), "--method", "direct", "--model", str(tmp_path / "no_model")])
    assert f"--data {legacy} row 0: row has no question" in capsys.readouterr().err


class SeededAgent:
    """A sampling policy whose answer is its request's seed read aloud: Paris when seed % 3 == 0, else Lyon, so
    which conversations score follows from the seeds alone."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.eos_token_ids = {int(tokenizer.eos_token_id)}
        self.seeds: list[int] = []

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        assert request.prompt_ids is not None and request.sampling.seed is not None
        self.seeds.append(request.sampling.seed)
        text = "<answer> Paris </answer>" if request.sampling.seed % 3 == 0 else "<answer> Lyon </answer>"
        ids = [*self.tok(text, add_special_tokens=False)["input_ids"], self.tok.eos_token_id]
        return [Completion(request.request_id, list(request.prompt_ids), ids, text, "stop", [0.0] * len(ids))]

    def generate(self, requests: Any) -> Any:
        raise NotImplementedError("the agent loop only calls agenerate")

    def update_weights(self, named_tensors: Any) -> None:
        return None


def test_n_samples_per_question_are_seeded_records_and_the_means_cover_all(corpus: dict[str, Path]) -> None:
    from rlloom_apps.search_agent.data import to_row

    tok = char_tokenizer()
    long_question = "what is the capital of italy " + "and of nowhere " * 150  # does not fit 1,500 tokens
    rows = [*rows_of(corpus["nq"]), to_row("hotpotqa", {"question": long_question, "answer": "Rome"}, 7, "test")]
    settings = EvalSettings(progress=False, n=3, temperature=0.7, seed=5, max_total_tokens=1500)
    engine = SeededAgent(tok)
    found = asyncio.run(evaluate(engine, tok, rows, "direct", settings))  # type: ignore[arg-type]
    # conversation c (question i's sample k: c = 3i + k) samples its one turn with seed 5 + 1,000,003 c; the two
    # nq questions run, the overlong one never reaches the engine
    assert sorted(engine.seeds) == [5 + 1_000_003 * c for c in range(6)]
    assert [(r.question[:30], r.sample) for r in found] == [
        ("what is the capital of france", 0), ("what is the capital of france", 1),
        ("what is the capital of france", 2), ("what is the capital of germany", 0),
        ("what is the capital of germany", 1), ("what is the capital of germany", 2),
        (long_question[:30], 0), (long_question[:30], 1), (long_question[:30], 2),
    ]  # fmt: skip
    # 1,000,003 = 1 (mod 3), so seed 5 + 1,000,003 c = 2 + c (mod 3) is 0 for c = 1 and 4: France's sample 1
    # answers Paris (right), Germany's sample 1 answers Paris too (wrong); every other answer is Lyon
    assert [r.prediction for r in found[:6]] == ["Lyon", "Paris", "Lyon", "Lyon", "Paris", "Lyon"]
    assert [r.em for r in found] == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [r.finish_reason for r in found[6:]] == ["overlong_prompt"] * 3
    scores = source_scores(found)
    assert scores["nq"] == {
        "em": pytest.approx(1 / 6), "f1": pytest.approx(1 / 6), "sub_em": pytest.approx(1 / 6), "searches": 0.0,
        "n": 2.0, "samples": 3.0, "overlong": 0.0, "scoring_errors": 0.0,
    }  # fmt: skip
    assert (scores["hotpotqa"]["n"], scores["hotpotqa"]["overlong"]) == (1.0, 3.0)
    assert markdown_table({"direct": scores}).splitlines() == [
        "| Method (avg@3) | NQ | HotpotQA | Avg. |",
        "|---|---|---|---|",
        "| direct | 0.167 | 0.000 | 0.083 |",
    ]
    (warning,) = problems_report("direct", found, 1500)
    assert "1 of 3 prompts do not fit" in warning  # questions, not conversations


def _eval_direct(corpus: dict[str, Path], model: dict[str, Path], out: Path, *extra: str) -> list[dict[str, Any]]:
    main(
        [
            "eval", "--data", str(corpus["nq"]), str(corpus["hotpotqa"]), "--model", str(model["model"]),
            "--tokenizer", str(model["tokenizer"]), "--device", "cpu", "--method", "direct", "--limit", "1",
            "--max-tokens-per-turn", "8", "--out", str(out), *extra,
        ]
    )  # fmt: skip
    return [json.loads(line) for line in (out / "predictions_direct.jsonl").read_text().splitlines()]


def test_eval_command_n_samples_each_question_through_one_engine(
    corpus: dict[str, Path], tiny_model: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    greedy = _eval_direct(corpus, tiny_model, tmp_path / "default")
    assert _eval_direct(corpus, tiny_model, tmp_path / "n1", "--n", "1") == greedy  # --n 1 is the default
    assert [p["sample"] for p in greedy] == [0, 0]
    sampled = ["--n", "3", "--temperature", "1.0", "--seed", "11"]
    preds = _eval_direct(corpus, tiny_model, tmp_path / "n3", *sampled)
    capsys.readouterr()
    assert [(p["data_source"], p["sample"]) for p in preds] == [("nq", k) for k in range(3)] + [
        ("hotpotqa", k) for k in range(3)
    ]
    for source in ("nq", "hotpotqa"):  # a randomly initialised model at temperature 1: distinct seeds, distinct texts
        assert len({p["response"] for p in preds if p["data_source"] == source}) > 1
    scores = json.loads((tmp_path / "n3" / "results.json").read_text())["direct"]
    for source in ("nq", "hotpotqa"):
        mine = [p for p in preds if p["data_source"] == source]
        assert scores[source]["em"] == pytest.approx(sum(p["em"] for p in mine) / 3)
        assert scores[source]["f1"] == pytest.approx(sum(p["f1"] for p in mine) / 3)
        assert (scores[source]["n"], scores[source]["samples"]) == (1.0, 3.0)
    assert (tmp_path / "n3" / "table.md").read_text().startswith("| Method (avg@3) | NQ | HotpotQA | Avg. |")
    assert _eval_direct(corpus, tiny_model, tmp_path / "again", *sampled) == preds  # seeded: the run repeats
