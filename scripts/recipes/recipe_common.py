"""What both recipes share: their common flags, the chain of app commands (logged, timed), the paired bootstrap,
and the report.

A recipe is a chain of the apps' own commands (prepare-data, warm-up, train, eval) so that what it reports is what
a user typing those commands gets; this module runs them one after another, keeps each exact command line and its
wall time, and turns per-row scores at three points (untrained, warmed up, after RL) into a JSON report, a
markdown table and a PNG. A recipe states only what is its own: the app, its data, its eval and train flags.
The interval is a paired bootstrap because the three points score the same held-out rows: resampling rows (not
points) keeps each row's difficulty on both sides of the difference.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

POINTS = ("untrained", "warmup", "rl")
ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "smollm2-135m-instruct"


@dataclass(frozen=True)
class Interval:
    """Mean of (after - before) over paired rows and its percentile bootstrap interval."""

    mean: float
    low: float
    high: float
    level: float
    resamples: int
    rows: int

    @property
    def above_zero(self) -> bool:
        return self.low > 0.0


def paired_bootstrap(
    before: Sequence[float], after: Sequence[float], *, resamples: int = 10_000, level: float = 0.95, seed: int = 0
) -> Interval:
    """Percentile bootstrap of mean(after - before): rows are drawn with replacement, the same row on both sides."""
    if len(before) != len(after):
        raise ValueError(f"paired_bootstrap: {len(before)} 'before' scores but {len(after)} 'after'; pair each row")
    if not before:
        raise ValueError("paired_bootstrap: no rows to compare")
    if not 0.0 < level < 1.0:
        raise ValueError(f"paired_bootstrap: level must lie in (0, 1), got {level}")
    diff = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[picks].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(float(diff.mean()), float(low), float(high), level, resamples, len(diff))


@dataclass
class Runner:
    """Runs commands in order, echoing and logging each, and keeps (command, seconds) for the report."""

    log: Path
    steps: list[dict[str, Any]] = field(default_factory=list)

    def __call__(
        self, name: str, argv: Sequence[object], *, env: Mapping[str, str] | None = None, done: Path | None = None
    ) -> float:
        """Run one step; with `done` (a file the step writes last) already there, keep it: a rerun resumes."""
        line = shlex.join(str(a) for a in argv)
        if done is not None and done.exists():
            print(f"[recipe] {name}: kept from an earlier run ({done} exists)", flush=True)
            self.steps.append({"step": name, "command": line, "seconds": 0.0, "exit": 0, "kept": True})
            return 0.0
        print(f"\n[recipe] {name}: {line}", flush=True)
        started = time.perf_counter()
        with self.log.open("a", encoding="utf-8") as handle:
            handle.write(f"\n$ {line}\n")
            handle.flush()
            argv_text = list(map(str, argv))
            code = subprocess.run(argv_text, check=False, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
        seconds = time.perf_counter() - started
        self.steps.append({"step": name, "command": line, "seconds": round(seconds, 1), "exit": code})
        if code != 0:
            tail = "".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-30:])
            raise SystemExit(f"[recipe] {name} failed (exit {code}); last lines of {self.log}:\n{tail}")
        print(f"[recipe] {name}: done in {seconds:.0f} s", flush=True)
        return seconds


def tool(name: str) -> str:
    """An app's console script next to this interpreter (the recipe's venv), so the commands run in it."""
    return str(Path(sys.executable).parent / name)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def chain_parser(doc: str | None, app: str, run: str, *, steps: int, lr: float) -> argparse.ArgumentParser:
    """The flags every recipe takes (its own, such as --max-tokens, the recipe adds after): the model, the run
    folder `runs/RUN`, how many rows, the warm-up and GRPO sizes, the engine, and `APP train` overrides."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help=f"extra `{app} train` overrides, e.g. actor.lr=5e-6")
    p.add_argument("--model", type=Path, default=MODEL, help="instruct model folder (default: %(default)s)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / run, help="run folder (default: %(default)s)")
    p.add_argument("--train-rows", type=int, default=400, help="training rows used (default: %(default)s)")
    p.add_argument("--dev-rows", type=int, default=100, help="held-out rows measured (default: %(default)s)")
    p.add_argument("--warmup-lr", type=float, default=1e-5, help="supervised learning rate (default: %(default)s)")
    p.add_argument("--steps", type=int, default=steps, help="GRPO steps (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per GRPO step (default: %(default)s)")
    p.add_argument("--n", type=int, default=4, help="samples per prompt (default: %(default)s)")
    p.add_argument("--lr", type=float, default=lr, help="GRPO learning rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="warm-up and GRPO seed: another seed of the chain; the evals "
                   "keep theirs, so every run scores the same sampled dev set (default: %(default)s)")  # fmt: skip
    p.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="rollout/eval engine (default: vllm)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder when not in --model")
    return p


def cpu_grpo_overrides(args: argparse.Namespace, start: Path, run: Path, own: Sequence[str]) -> list[str]:
    """The grpo config cut to a CPU: one optimizer step per GRPO step, float32, eager vLLM, no in-run validation,
    no KL term (the reference model's forward was 15-16% of a step for a 0.001 coefficient; Dr. GRPO and DAPO drop
    it too); then the recipe's `own` keys, and the user's overrides last (they win)."""
    out = [
        f"model.path={start}",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        f"data.train_batch_size={args.prompts}",
        f"rollout.n={args.n}",
        f"rollout.max_tokens={args.max_tokens}",
        "rollout.vllm.enforce_eager=true",
        "rollout.vllm.cpu_kvcache_space_gib=1",
        f"actor.mini_batch_size={args.prompts}",
        f"actor.lr={args.lr}",
        "actor.warmup_steps=0",
        "algorithm.kl.use_loss=false",
        f"trainer.total_steps={args.steps}",
        f"trainer.save_every={args.steps}",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.device=cpu",
        f"trainer.seed={args.seed}",
        "trainer.trackers=[console,jsonl]",
        f"trainer.output_dir={run}",
        *own,
    ]
    if args.tokenizer is not None:
        out.append(f"model.tokenizer_path={args.tokenizer}")
    return [*out, *args.overrides]


def tokenizer_flag(tokenizer: Path | None) -> list[str | Path]:
    return ["--tokenizer", tokenizer] if tokenizer is not None else []


def warmup_command(args: argparse.Namespace, app: str, rows: Path, out: Path, own: Sequence[Any]) -> list[Any]:
    """`APP warmup` of --model on `rows` into `out`, with the app's `own` flags (its length of training)."""
    return [tool(app), "warmup", "--model", args.model, *tokenizer_flag(args.tokenizer), "--train-data", rows,
            "--out", out, *own, "--lr", args.warmup_lr, "--seed", args.seed]  # fmt: skip


@dataclass
class Chain:
    """One recipe run: prepare-data, an eval at each point (with the recipe's sampling flags), warm-up and GRPO
    through the app `app`, each step logged and timed by one `Runner` in the run folder, and the per-row scores
    gathered for the report."""

    args: argparse.Namespace
    app: str  # the console script the chain drives: reasoning, search-agent
    eval_flags: Sequence[Any]  # the app's own `eval` flags (sampling, retrieval, limits)
    row_scores: Callable[[Path], dict[str, list[float]]]  # an eval folder -> {metric: per-row scores, dev order}
    out: Path = field(init=False)
    run: Runner = field(init=False)
    scores: dict[str, dict[str, list[float]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.args.model / "config.json").exists():
            raise SystemExit(
                f"--model {self.args.model}: no config.json there; write SmolLM2 with `python3 -m nox -s smollm2`"
            )
        self.out = self.args.out.resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.run = Runner(self.out / "commands.log")

    @property
    def train_rows(self) -> Path:
        return self.out / "rows" / "train.jsonl"

    @property
    def dev_rows(self) -> Path:
        return self.out / "rows" / "dev.jsonl"

    @property
    def warm(self) -> Path:
        """The warmed-up model's folder."""
        return self.out / "warmup_model"

    @property
    def grpo(self) -> Path:
        """The GRPO run's folder."""
        return self.out / "grpo"

    def prepare(self, data: Path, source: Sequence[str]) -> None:
        """`APP prepare-data` of the shipped train.jsonl and dev.jsonl in `data`, cut to --train-rows/--dev-rows."""
        for rows, split, limit in ((self.train_rows, "train", self.args.train_rows),
                                   (self.dev_rows, "dev", self.args.dev_rows)):  # fmt: skip
            self.run(f"prepare-data {split}", [tool(self.app), "prepare-data", *source, "--input",
                     data / f"{split}.jsonl", "--out", rows, "--split", split, "--limit", limit])  # fmt: skip

    def measure(self, point: str, model: Path) -> None:
        """`APP eval` of `point`'s model on the dev rows, run right after the point exists (a failure shows
        early); a rerun keeps a point whose table.md is there."""
        folder = self.out / "eval" / point
        self.run(f"eval {point}", self.eval_command(point, model), done=folder / "table.md")
        self.scores[point] = self.row_scores(folder)

    def eval_command(self, point: str, model: Path) -> list[Any]:
        """`APP eval` of `model` into eval/POINT. vLLM starts eager, as in training: a 100-row eval decodes for
        minutes, too short for compilation's faster decoding to repay its longer start (docs/recipes.md)."""
        args = self.args
        tokenizer = tokenizer_flag(args.tokenizer if point == "untrained" else None)
        return [tool(self.app), "eval", "--model", model, *tokenizer, *self.engine_flags(),
                "--data", self.dev_rows, *self.eval_flags, "--out", self.out / "eval" / point]  # fmt: skip

    def engine_flags(self) -> list[str]:
        """--engine, and how it runs here: HF on the CPU, vLLM eager (as in training)."""
        device = ["--device", "cpu"] if self.args.engine == "hf" else ["--enforce-eager"]
        return ["--engine", self.args.engine, *device]

    def warm_up(self, command: Sequence[Any]) -> Path:
        """Run the warm-up `command` (kept on a rerun once warmup.json is written); returns the model's folder."""
        self.run("warm-up", command, done=self.warm / "warmup.json")
        return self.warm

    def filter_rows(self, model: Path, flags: Sequence[Any]) -> Path:
        """`APP filter-rows` of the training rows with `model` (offline difficulty filtering, sampled with `flags`)
        into rows/train_filtered.jsonl, its eval files in eval/train_pass (kept on a rerun); returns the rows."""
        kept = self.out / "rows" / "train_filtered.jsonl"
        command = [tool(self.app), "filter-rows", "--model", model, *self.engine_flags(), "--data", self.train_rows,
                   *flags, "--out", kept, "--eval-out", self.out / "eval" / "train_pass"]  # fmt: skip
        self.run("filter-rows", command, done=kept)
        return kept

    def train(self, flags: Sequence[Any], rows: Path | None = None) -> Path:
        """`APP train --config grpo` on `rows` (default: the training rows) with `flags` (overrides); returns the
        last step's checkpoint."""
        train = [tool(self.app), "train", "--config", "grpo", "--engine", self.args.engine]
        self.run("train", [*train, "--train-data", rows or self.train_rows, *flags])
        return self.grpo / "checkpoints" / f"step_{self.args.steps}"

    def report(self, title: str, comparisons: Mapping[str, tuple[str, str, str]]) -> dict[str, Any]:
        """The training curves (best effort) and the report of the three points."""
        subprocess.run([tool("reasoning"), "plot", self.grpo, "--out", self.out / "curves.png"], check=False)
        sizes = {"train_rows": self.args.train_rows, "dev_rows": self.args.dev_rows, "grpo_steps": self.args.steps}
        return write_report(self.out, title, scores=self.scores, comparisons=comparisons, runner=self.run, extra=sizes)


def write_report(
    out: Path,
    title: str,
    *,
    scores: Mapping[str, Mapping[str, list[float]]],
    comparisons: Mapping[str, tuple[str, str, str]],
    runner: Runner,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """report.json, report.md and points.png from per-row scores {point: {metric: [row scores]}}.

    `comparisons` names each interval: {label: (metric, before point, after point)}.
    """
    means = {p: {m: float(np.mean(v)) for m, v in per.items()} for p, per in scores.items()}
    intervals = {
        label: asdict(paired_bootstrap(scores[a][m], scores[b][m])) for label, (m, a, b) in comparisons.items()
    }
    report = {
        "title": title,
        "means": means,
        "intervals": intervals,
        "commands": runner.steps,
        "wall_s": round(sum(s["seconds"] for s in runner.steps), 1),
        **extra,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    metrics = list(next(iter(scores.values())))
    lines = [f"# {title}", "", "| point | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    lines += [f"| {p} | " + " | ".join(f"{means[p][m]:.3f}" for m in metrics) + " |" for p in means]
    lines += ["", "| difference | mean | 95% paired bootstrap |", "|---|---|---|"]
    lines += [f"| {k} | {v['mean']:+.3f} | [{v['low']:+.3f}, {v['high']:+.3f}] |" for k, v in intervals.items()]
    lines += ["", f"wall: {report['wall_s']:.0f} s", "", "```"] + [s["command"] for s in runner.steps] + ["```", ""]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    plot_points(out / "points.png", title, means)
    print("\n".join(lines), flush=True)
    return report


def plot_points(path: Path, title: str, means: Mapping[str, Mapping[str, float]]) -> None:
    """One panel per metric, its held-out mean at each point; skipped with a note when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[recipe] matplotlib not installed: no points.png", flush=True)
        return
    points = list(means)
    metrics = list(next(iter(means.values())))
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        ax.plot(points, [means[p][metric] for p in points], marker="o")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
