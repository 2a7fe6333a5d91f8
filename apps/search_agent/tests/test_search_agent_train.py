"""`search-agent train`: the published configs load, bad input is refused by name, and a tiny run trains.

The tiny run goes through everything a real one does (prepare-data rows with Search-R1's prompt, an
rlloom-retrieval BM25 index loaded in-process, AgentLoop rollouts on HFEngine, GRPO, validation) with a
randomly initialised character model, so its figures are checked against the trajectories' own metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rlloom_apps.search_agent.cli import main
from rlloom_apps.search_agent.data import prepare
from rlloom_apps.search_agent.evaluate import EvalSettings
from rlloom_apps.search_agent.settings import CONFIGS, SearchSettings, load_train_config
from rlloom_apps.search_agent.train import loop_config

from rlloom.agent import AgentLoop, SearchEnv, SearchEnvConfig, ThreadedRetriever
from rlloom.agent.training import loop_config_for
from rlloom.core_rl.config import ConfigError
from rlloom.core_rl.contracts import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import char_tokenizer, save_tiny_model
from rlloom.retrieval import build_index, load_index

PASSAGES = [
    ("Paris", "Paris is the capital of France."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Rome", "Rome is the capital of Italy."),
]
QUESTIONS = [
    {"question": "what is the capital of france", "answer": ["Paris"]},
    {"question": "what is the capital of germany", "answer": ["Berlin"]},
]


def test_published_configs_load_with_search_r1_settings() -> None:
    grpo, search = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m"])
    assert (grpo.algorithm.advantage.estimator, grpo.rollout.n, grpo.actor.lr) == ("grpo", 5, 1e-6)
    assert (grpo.algorithm.kl.loss_coef, grpo.algorithm.kl.loss_type) == (0.001, "low_var_kl")
    assert search == SearchSettings(top_k=3, max_turns=5, max_obs_tokens=500, max_total_tokens=4096)
    ppo, ppo_search = load_train_config(CONFIGS / "ppo.yaml", ["search.max_turns=2"])
    assert (ppo.algorithm.advantage.estimator, ppo.rollout.n, ppo.critic.lr, ppo.algorithm.kl.reward_coef) == (
        "gae",
        1,
        1e-5,
        0.001,
    )
    assert ppo_search.max_turns == 2
    assert grpo.trainer.val_before_train and ppo.trainer.val_before_train  # Search-R1 validates the start model


class AlwaysSearches:
    """A policy that searches on every turn it gets, so the turn budget alone ends the conversation."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.eos_token_ids = {int(tokenizer.eos_token_id)}

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        text = "<search> capital of france </search>"
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        return [Completion(request.request_id, list(request.prompt_ids or []), ids, text, "stop", [0.0] * len(ids))]


@pytest.mark.parametrize("config", ["grpo", "ppo"])
def test_published_turn_budget_searches_as_often_as_search_r1(config: str, index: Path) -> None:
    # Search-R1's run_llm_loop (max_turns=4 in its v0.2 scripts): `max_turns` generations that may search, then a
    # final generation with do_search=False, so 4 searches and 5 model turns for a policy that always searches
    _, search = load_train_config(CONFIGS / f"{config}.yaml", ["model.path=/m"])
    tokenizer = char_tokenizer()
    retriever = ThreadedRetriever(load_index(index))
    env_config = SearchEnvConfig(top_k=search.top_k)
    loop = AgentLoop(AlwaysSearches(tokenizer), tokenizer, lambda: SearchEnv(retriever, None, env_config),
                     loop_config(search).model_copy(update={"progress": False}))  # fmt: skip
    try:
        (traj,) = loop.run([{"question": "what is the capital of france", "golden_answers": ["Paris"]}])
    finally:
        retriever.close()
    assert (traj.metrics["searches"], traj.metrics["searches_skipped"], traj.metrics["turns"]) == (4, 1, 5)
    assert traj.response_text.count("<information>") == 4
    assert EvalSettings().max_turns == search.max_turns  # `eval` follows the protocol training used


def test_rollout_max_tokens_alone_sets_the_tokens_per_turn() -> None:
    # the README: per-turn sampling and its cap come from `rollout`; the loop's default 500 used to win silently
    config, search = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m", "rollout.max_tokens=800"])
    sampling = SamplingParams(max_tokens=config.rollout.max_tokens)
    assert loop_config_for(loop_config(search), sampling).max_tokens_per_turn == 800
    published, search = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m"])
    sampling = SamplingParams(max_tokens=published.rollout.max_tokens)
    assert loop_config_for(loop_config(search), sampling).max_tokens_per_turn == 500  # Search-R1's


def test_bad_search_keys_and_values_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="search.top_kk"):
        load_train_config(CONFIGS / "grpo.yaml", ["search.top_kk=2"])
    with pytest.raises(ConfigError, match="search.max_turns"):
        load_train_config(CONFIGS / "grpo.yaml", ["search.max_turns=0"])
    with pytest.raises(ConfigError, match="actor.lrr"):
        load_train_config(CONFIGS / "grpo.yaml", ["actor.lrr=1"])


@pytest.fixture
def index(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": str(i), "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(PASSAGES))
    )
    build_index(corpus, tmp_path / "index", "bm25")
    return tmp_path / "index"


def test_cli_refuses_a_missing_model_folder(tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("")
    with pytest.raises(SystemExit):
        main(["train", "--train-data", str(rows), "--index", str(index)])
    assert "model.path=SET_ME is not a folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"question": "what is the capital of france"}, "row 0 is not a prepare-data row"),  # no gold at all
        ({"question": "what is the capital of france", "answer": ["Paris"]}, "row 0 is not a prepare-data row"),
        ({"data_source": "nq", "reward_model": {"ground_truth": {"target": []}}}, "bad reward_model.ground_truth"),
    ],
)
def test_train_refuses_rows_without_gold_before_the_model_loads(
    tmp_path: Path, index: Path, record: dict[str, object], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(record) + "\n")
    for flag in ("--train-data", "--val-data"):
        good = tmp_path / "good.jsonl"
        prepare("nq", _raw(tmp_path), good)
        data = {"--train-data": good, "--val-data": good, flag: rows}
        with pytest.raises(SystemExit):  # model.path is missing too: the rows are refused first
            main(["train", "--train-data", str(data["--train-data"]), "--val-data", str(data["--val-data"]),
                  "--index", str(index), "model.path=/no/such/model"])  # fmt: skip
        err = capsys.readouterr().err
        assert f"{flag} {rows} {message}" in err or (f"{flag} {rows} row 0: {message}" in err), err


def test_train_refuses_a_folder_that_is_not_an_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.jsonl"
    prepare("nq", _raw(tmp_path), good)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main(["train", "--train-data", str(good), "--index", str(tmp_path / "empty"), "model.path=/no/such/model"])
    assert "--index" in (err := capsys.readouterr().err) and "not an rlloom index" in err


def _raw(tmp_path: Path) -> Path:
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return raw


@pytest.mark.slow
@pytest.mark.parametrize("config", ["grpo", "ppo"])
def test_tiny_run_trains_with_search(tmp_path: Path, config: str) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": str(i), "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(PASSAGES))
    )
    index = build_index(corpus, tmp_path / "index", "bm25")
    source = tmp_path / "nq.jsonl"
    source.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    rows = tmp_path / "train.jsonl"
    prepare("nq", source, rows, split="train")
    save_tiny_model(tmp_path, max_position_embeddings=2048)
    out = tmp_path / "run"
    main(
        [
            "train",
            "--config", config,
            "--train-data", str(rows),
            "--val-data", str(rows),
            "--index", str(index),
            f"model.path={tmp_path / 'model'}",
            f"model.tokenizer_path={tmp_path / 'tokenizer'}",
            "model.dtype=float32",
            "model.gradient_checkpointing=false",
            "data.train_batch_size=2",
            f"rollout.n={2 if config == 'grpo' else 1}",
            "rollout.max_tokens=8",
            "actor.mini_batch_size=2",
            "actor.warmup_steps=0",
            "critic.mini_batch_size=2",
            "critic.warmup_steps=0",
            "trainer.total_steps=2",
            "trainer.save_every=0",
            "trainer.val_every=2",
            "trainer.device=cpu",
            "trainer.trackers=[jsonl]",
            f"trainer.output_dir={out}",
            "search.max_turns=2",
            "search.max_obs_tokens=32",
            "search.max_total_tokens=2048",
        ]
    )  # fmt: skip
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/mean" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert line["batch/samples"] == (4 if config == "grpo" else 2)  # 2 prompts x rollout.n
        assert 1 <= line["rollout/turns/mean"] <= 2
        # a random model writes no valid action: every turn but the last gets Search-R1's corrective text
        assert line["rollout/invalid_actions/mean"] == line["rollout/turns/mean"]
        assert line["reward/mean"] == 0.0 and line["reward_components/outcome"] == 0.0
        assert ("values/mean" in line) == (config == "ppo")  # PPO trains a critic, GRPO has none
    assert any("val/reward/mean" in line for line in lines)
    assert (out / "checkpoints").is_dir()


def test_train_refuses_a_prompt_longer_than_the_conversation_before_training(
    tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # one over-long row among good ones used to stop the run with a traceback at whatever step drew it
    rows = tmp_path / "train.jsonl"
    prepare("nq", _raw(tmp_path), rows, split="train")
    long = json.loads(rows.read_text().splitlines()[0])
    long["prompt"][0]["content"] += " very long context" * 60  # the character model: one token per character
    rows.write_text(rows.read_text() + json.dumps(long) + "\n")
    save_tiny_model(tmp_path, max_position_embeddings=1024)
    out = tmp_path / "run"
    argv = ["train", "--train-data", str(rows), "--index", str(index), f"model.path={tmp_path / 'model'}",
            f"model.tokenizer_path={tmp_path / 'tokenizer'}", "trainer.device=cpu", f"trainer.output_dir={out}",
            "search.max_total_tokens=900"]  # fmt: skip
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert f"--train-data {rows} row 3 of 3: the prompt is" in err and "the conversation's 900" in err, err
    assert not (out / "metrics.jsonl").exists()  # refused before any step
    # the model's 1,024 positions cap a larger search.max_total_tokens, as the rollout engine caps it
    with pytest.raises(SystemExit):
        main([*argv[:-1], "search.max_total_tokens=4096"])
    assert "the conversation's 1024" in capsys.readouterr().err


def test_train_reads_verls_list_of_data_files_in_order(
    tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """data.train_files as a list: the files' rows are one split in order (the over-long row, last of the second
    file, is row 5 of 5: 2 rows, then 2 + 1), checked before any step."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    prepare("nq", _raw(tmp_path), first, split="train")
    long = json.loads(first.read_text().splitlines()[0])
    long["prompt"][0]["content"] += " very long context" * 60
    second.write_text(first.read_text() + json.dumps(long) + "\n")
    save_tiny_model(tmp_path, max_position_embeddings=1024)
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        main(["train", f"data.train_files=['{first}', '{second}']", "--index", str(index),
              f"model.path={tmp_path / 'model'}", f"model.tokenizer_path={tmp_path / 'tokenizer'}",
              "trainer.device=cpu", f"trainer.output_dir={out}", "search.max_total_tokens=900"])  # fmt: skip
    err = capsys.readouterr().err
    assert f"--train-data {first}, {second} row 5 of 5: the prompt is" in err, err
    assert not (out / "metrics.jsonl").exists()


def test_train_reads_a_string_prompt_as_single_turn_training_does() -> None:
    """TRL's string prompt is one user message for the agent too (one reading of rows, core-rl's): it was refused
    here while single-turn training took it."""
    from rlloom.agent.environment import Sample

    row = {"data_source": "nq", "prompt": "who wrote hamlet?", "reward_model": {"ground_truth": {"target": ["x"]}}}
    sample = Sample.from_row(row)
    assert sample.prompt == [{"role": "user", "content": "who wrote hamlet?"}]
    assert sample.ground_truth == {"target": ["x"]}


def test_chat_template_variables_reach_the_loop_and_the_prompt_length_check() -> None:
    """data.apply_chat_template_kwargs (Qwen3's enable_thinking) is rendered into every conversation's prompt, so
    the length check before training must count it too."""
    from rlloom_apps.search_agent.train import fitting_rows

    from rlloom.agent.environment import Sample
    from rlloom.agent.envs.search import search_prompt
    from rlloom.agent.turns import TurnTemplate
    from rlloom.core_rl.data import DataError
    from rlloom.core_rl.tiny import CHATML_TEMPLATE

    tok = char_tokenizer()
    generation_prompt = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    assert generation_prompt in CHATML_TEMPLATE
    tok.chat_template = CHATML_TEMPLATE.replace(
        generation_prompt,
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
        "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think></think>' }}{% endif %}{% endif %}",
    )
    rows = [{"question": "who wrote it", "golden_answers": ["x"]}]
    env = SearchEnvConfig()
    plain = len(TurnTemplate(tok).prompt_ids(search_prompt(Sample.from_row(rows[0]), env)))
    quiet = {"enable_thinking": False}
    assert fitting_rows(rows, tok, env, plain + 1, "rows", drop=True) == rows
    with pytest.raises(DataError, match=f"every rows row is over {plain} tokens"):  # the think block
        fitting_rows(rows, tok, env, plain + 1, "rows", drop=True, chat_template_kwargs=quiet)
    search = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m"])[1]
    assert loop_config(search, quiet).chat_template_kwargs == quiet


def test_eval_settings_carry_chat_template_variables_into_the_loop() -> None:
    settings = EvalSettings(chat_template_kwargs={"enable_thinking": False})
    assert settings.loop_config().chat_template_kwargs == {"enable_thinking": False}
    assert EvalSettings().loop_config().chat_template_kwargs == {}


def test_train_names_its_own_setting_for_search_r1_servers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server without GET /health (Search-R1's has only /retrieve): the error used to say `--retrieval-api
    search-r1`, a flag `train` does not have; its setting is the config override search.retrieval_api."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class OnlyRetrieve(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    good = tmp_path / "good.jsonl"
    prepare("nq", _raw(tmp_path), good)
    with ThreadingHTTPServer(("127.0.0.1", 0), OnlyRetrieve) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        base = ["train", "--train-data", str(good), "--retrieval-url", url, "model.path=/no/such/model"]
        with pytest.raises(SystemExit):
            main(base)
        err = capsys.readouterr().err
        assert "answered GET /health with HTTP 404" in err and "search.retrieval_api=search-r1" in err
        assert "--retrieval-api" not in err
        with pytest.raises(SystemExit):  # the setting it names is accepted: now model.path is what fails
            main([*base, "search.retrieval_api=search-r1"])
        err = capsys.readouterr().err
        assert "GET /health" not in err
        server.shutdown()
