"""Run an evaluation end to end: sample n responses per problem from any engine, score them, report avg@n,
pass@k and maj@k per data source, response lengths, and write the results.

Engine-agnostic and torch-free: the caller passes an object with `agenerate(request)` and a `request_for(index,
row)` that builds each row's request (text prompts for `reasoning eval`, prompts with images for
`vlm-geo3k eval`). Scoring and metrics are `rlloom.rewards.evaluation`'s. Sampling defaults are DeepSeek-R1's
evaluation settings (temperature 0.6, top-p 0.95); temperature 0 is greedy (then use n=1). Requests should be
seeded with `settings.seed + index` so a run repeats on the same engine and hardware.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tqdm.auto import tqdm

from rlloom.rewards.evaluation import EvalReport, evaluate_samples


class EvalSettings(BaseModel):
    """How many samples, how to sample them, and which k to report."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(default=1, ge=1, description="samples per problem (avg@n averages them)")
    k: list[int] = Field(default_factory=list, description="k values for pass@k and maj@k (default: 1, 2, 4 .. n)")
    temperature: float = Field(default=0.6, ge=0.0, description="sampling temperature (0: greedy)")
    top_p: float = Field(default=0.95, gt=0.0, le=1.0, description="nucleus sampling mass")
    max_tokens: int = Field(default=4096, ge=1, description="response length limit in tokens")
    seed: int = Field(default=0, description="problem i samples with seed + i")
    concurrency: int = Field(default=256, ge=1, description="problems sampled at once (engine requests in flight)")
    score_workers: int | None = Field(default=None, ge=0, description="scoring processes (default: one per core)")
    score_timeout: float = Field(default=30.0, gt=0.0, description="seconds per sample's scoring at most")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="extra chat-template variables as JSON, e.g. '{\"enable_thinking\": false}' for Qwen3 (give "
        "what the model was trained with: data.apply_chat_template_kwargs)",
    )

    @model_validator(mode="after")
    def _ks(self) -> EvalSettings:
        if not self.k:
            self.k = default_ks(self.n)
        bad = [k for k in self.k if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"--k {bad} must lie in 1..--n ({self.n}): pass@k needs at least k samples per problem")
        self.k = sorted(set(self.k))
        return self


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """`--n`, `--k`, `--temperature` ... (one flag per `EvalSettings` field) in a "sampling and metrics" group."""
    group = parser.add_argument_group("sampling and metrics")
    for name, field in EvalSettings.model_fields.items():
        flag = f"--{name.replace('_', '-')}"
        if name == "k":
            group.add_argument(flag, type=int, nargs="+", default=[], help=field.description)
        elif name == "score_workers":
            group.add_argument(flag, type=int, default=None, help=field.description)
        elif name == "chat_template_kwargs":
            group.add_argument(flag, type=json_object, default={}, help=field.description)
        else:
            kind = float if field.annotation is float else int
            group.add_argument(flag, type=kind, default=field.default, help=field.description)


def json_object(text: str) -> dict[str, Any]:
    """argparse type: a JSON object (argparse names the flag and shows this message when it is not one)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        example = '{"enable_thinking": false}'
        raise argparse.ArgumentTypeError(f"not JSON ({err.msg}); give an object, e.g. '{example}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"give a JSON object, e.g. '{{\"enable_thinking\": false}}', not {text!r}")
    return value


def flag_errors(err: ValidationError) -> str:
    """A settings model's validation errors as the command-line flags that set its fields (`top_p` -> `--top-p`),
    without pydantic's field dump and documentation URL; the message for the user to fix the flag."""
    parts = []
    for problem in err.errors():
        message = str(problem["msg"]).removeprefix("Value error, ")
        fields = [str(part) for part in problem["loc"]]
        if fields:
            given = problem.get("input")
            flag = "--" + fields[0].replace("_", "-")
            parts.append(f"{flag} {given}: {message[:1].lower()}{message[1:]}")
        else:
            parts.append(message)
    return "; ".join(parts)


def settings_from_args(args: argparse.Namespace) -> EvalSettings:
    """The `EvalSettings` that `add_eval_arguments`' flags hold; a bad value raises ValueError naming its flag."""
    try:
        return EvalSettings(**{name: getattr(args, name) for name in EvalSettings.model_fields})
    except ValidationError as err:
        raise ValueError(flag_errors(err)) from None


def sampling_warnings(settings: EvalSettings) -> list[str]:
    """Settings that are valid but make some figures meaningless: greedy decoding with n > 1."""
    if settings.temperature == 0 and settings.n > 1:
        return [
            f"--temperature 0 is greedy: the --n {settings.n} samples of a problem are identical, so pass@k and "
            "maj@k equal avg@n; sample (e.g. --temperature 0.6) or use --n 1"
        ]
    return []


def scoring_error_warning(report: EvalReport, *, shown: int = 3) -> str | None:
    """A loud line when any sample's scorer reported an error (those samples score 0), with the count and the
    first distinct messages; None when there were none."""
    errors = [r.error for r in report.records if r.error is not None]
    if not errors:
        return None
    distinct = list(dict.fromkeys(errors))
    listed = "; ".join(repr(e[:200]) for e in distinct[:shown])
    more = f" (and {len(distinct) - shown} other messages)" if len(distinct) > shown else ""
    return (
        f"WARNING: {len(errors)} of {len(report.records)} samples had scoring errors and scored 0, so the figures "
        f"above understate the model: {listed}{more}"
    )


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return sorted({*ks, n})


class LengthStats(BaseModel):
    """Response lengths of one data source: long-context reasoning runs are judged by these too."""

    mean_tokens: float
    max_tokens: int
    truncated: float = Field(description="share of samples that hit max_tokens (finish reason 'length')")


class EvalResult(BaseModel):
    report: EvalReport
    lengths: dict[str, LengthStats]
    responses: list[list[str]]


Sampled = tuple[list[list[str]], list[list[int]], list[list[str]]]


class SampledText(Protocol):
    """What evaluation reads of one sample (core-rl's `Completion` has these fields)."""

    @property
    def text(self) -> str: ...
    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def finish_reason(self) -> Any: ...


class AsyncSampler(Protocol):
    """An engine: `agenerate(request)` returns the request's samples (any rlloom engine, local or HTTP)."""

    async def agenerate(self, request: Any) -> Sequence[SampledText]: ...


RequestFor = Callable[[int, Mapping[str, Any]], Any]
"""Builds the engine request of row `index` (its prompt, images, and sampling seeded with `seed + index`)."""


def sample_rows(
    engine: AsyncSampler,
    rows: Sequence[Mapping[str, Any]],
    settings: EvalSettings,
    request_for: RequestFor,
    *,
    progress: bool = True,
) -> Sampled:
    """(texts, token counts, finish reasons), each a list per row of its n samples.

    Every row is its own `agenerate` call, at most `concurrency` in flight: the HF engine decodes them in one
    continuously refilled batch (no barrier between groups of problems), a server gets concurrent requests.
    """

    async def run_all() -> list[Sequence[SampledText]]:
        gate = asyncio.Semaphore(settings.concurrency)
        bar = tqdm(total=len(rows) * settings.n, desc="sampling", unit="sample", disable=not progress)

        async def one(index: int, row: Mapping[str, Any]) -> Sequence[SampledText]:
            async with gate:
                completions = await engine.agenerate(request_for(index, row))
            bar.update(len(completions))
            return completions

        try:
            return await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
        finally:
            bar.close()
            aclose = getattr(engine, "aclose", None)  # an HTTP engine's client belongs to this event loop
            if aclose is not None:
                await aclose()

    results = asyncio.run(run_all())
    texts = [[c.text for c in cs] for cs in results]
    lengths = [[len(c.token_ids) for c in cs] for cs in results]
    finishes = [[str(c.finish_reason) for c in cs] for cs in results]
    return texts, lengths, finishes


def run_eval(
    engine: AsyncSampler,
    rows: Sequence[Mapping[str, Any]],
    settings: EvalSettings,
    request_for: RequestFor,
    *,
    progress: bool = True,
) -> EvalResult:
    """Sample every row n times, score every sample, summarize per data source."""
    texts, lengths, finishes = sample_rows(engine, rows, settings, request_for, progress=progress)
    report = evaluate_samples(
        rows,
        texts,
        settings.k,
        workers=settings.score_workers,
        timeout=settings.score_timeout,
        progress=progress,
        seed=settings.seed,
    )
    per_source: dict[str, list[tuple[int, str]]] = {}
    for row, counts, reasons in zip(rows, lengths, finishes, strict=True):
        per_source.setdefault(str(row["data_source"]), []).extend(zip(counts, reasons, strict=True))
    stats = {
        source: LengthStats(
            mean_tokens=statistics.mean(c for c, _ in pairs),
            max_tokens=max(c for c, _ in pairs),
            truncated=sum(r == "length" for _, r in pairs) / len(pairs),
        )
        for source, pairs in per_source.items()
    }
    return EvalResult(report=report, lengths=stats, responses=texts)


def read_rows(
    paths: Sequence[Path], *, limit: int | None = None, made_by: str = "prepare-data"
) -> list[dict[str, Any]]:
    """The rows of JSONL files (the first `limit` of each); errors name the file, the line and `made_by`."""
    rows: list[dict[str, Any]] = []
    seen: dict[Path, Path] = {}
    for path in paths:
        if not path.is_file():
            raise ValueError(f"--data {path} does not exist (make rows with `{made_by}`)")
        if path.resolve() in seen:  # its problems would count twice in every figure
            raise ValueError(f"--data {path} is given twice (also as {seen[path.resolve()]}); list each file once")
        seen[path.resolve()] = path
        found = []
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from err
        rows += found[:limit] if limit is not None else found
    if not rows:
        raise ValueError("--data holds no rows")
    return rows


def report(result: EvalResult, rows: Sequence[Mapping[str, Any]], settings: EvalSettings, out: Path | None) -> None:
    """Print the figures (and a warning when samples had scoring errors); with `out`, also write the files there
    (`write_outputs`) and say so."""
    print(summary_text(result))
    warning = scoring_error_warning(result.report)
    if warning is not None:
        print(warning, file=sys.stderr)
    if out is not None:
        write_outputs(out, rows, result, settings)
        print(f"(written to {out})")


def summary_text(result: EvalResult) -> str:
    """The metrics table (percent), then response lengths per data source."""
    lines = [
        result.report.table(),
        "",
        "| data source | mean response tokens | longest | truncated |",
        "|---|---|---|---|",
    ]
    for source, s in result.lengths.items():
        lines.append(f"| {source} | {s.mean_tokens:.0f} | {s.max_tokens} | {100 * s.truncated:.1f}% |")
    return "\n".join(lines)


def write_outputs(out: Path, rows: Sequence[Mapping[str, Any]], result: EvalResult, settings: EvalSettings) -> None:
    """results.json (settings, figures, lengths), table.md, and samples_<source>.jsonl with every sample."""
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "settings": settings.model_dump(),
        "sources": [s.model_dump() for s in result.report.sources],
        "lengths": {k: v.model_dump() for k, v in result.lengths.items()},
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "table.md").write_text(summary_text(result) + "\n")
    handles: dict[str, Any] = {}
    try:
        for record in result.report.records:
            source = record.data_source
            if source not in handles:
                handles[source] = (out / f"samples_{_file_safe(source)}.jsonl").open("w", encoding="utf-8")
            line = {
                **record.model_dump(),
                "index": rows[record.problem].get("extra_info", {}).get("index", record.problem),
                "response": result.responses[record.problem][record.sample],
            }
            handles[source].write(json.dumps(line, ensure_ascii=False) + "\n")
    finally:
        for handle in handles.values():
            handle.close()


def _file_safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


__all__ = [
    "AsyncSampler",
    "EvalResult",
    "EvalSettings",
    "LengthStats",
    "RequestFor",
    "SampledText",
    "add_eval_arguments",
    "default_ks",
    "flag_errors",
    "read_rows",
    "report",
    "run_eval",
    "sample_rows",
    "sampling_warnings",
    "scoring_error_warning",
    "settings_from_args",
    "summary_text",
    "write_outputs",
]
