"""Prompt samplers: which training rows come next, and (for a curriculum) what each step's rewards teach it.

veRL lets a run name its own sampler (`data.sampler.class_path` + `class_name`, a `torch.utils.data.Sampler`
subclass of its `AbstractSampler`); a curriculum one (`AbstractCurriculumSampler`) has `update(batch)`, which the
trainer calls with each finished step's batch. rlloom's `data.sampler.class_path` names the class in one string,
`package.module:Class` or `path/to/file.py:Class`, with `data.sampler.kwargs` for its constructor.

A sampler has three methods and one optional one (`PromptSampler`):

- `next_ids(active, *, epoch, position, count)`: the next `count` row ids, each one of `active` (the rows still
  in play, in data order: online prompt filtering may have retired some). `PromptLoader` keeps the epoch
  bookkeeping (an epoch is `len(active)` rows; `position` of them are served) and the batch size, and checks the
  answer. Deciding from (its own state, `epoch`, `position`) alone, and not from how often it was called, is what
  makes a resume draw the same prompts: the loader restores `epoch`/`position`, the sampler its `state_dict`.
- `state_dict()` / `load_state_dict(state)`: the sampler's own state (JSON-like, saved in every checkpoint with the
  loader's position; a snapshot the sampler does not keep mutating — the loader deep-copies it anyway).
- `update(feedback)` (optional; a sampler with it is a curriculum): a `SamplerFeedback` per rollout round, the
  moment its rewards are known, before the policy update: one call per step, or one per round with
  `algorithm.dynamic_sampling`. The next draw therefore always knows every finished batch. With
  `trainer.one_step_off_policy` the batch of step s+1 is drawn during step s, right after step s's batch was
  taken and fed back; so the draw sees the same feedback as on-policy, but that feedback was produced by
  weights one update older (`rollout/policy_lag`).
- `metrics()` (optional): numbers logged with every step.

The constructor is called as `Class(rows, seed=trainer.seed, **data.sampler.kwargs)`, `rows` being the training
rows after `data.max_prompt_length` filtering (so a sampler may read a difficulty label from `extra_info`).
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rlloom.core_rl.config.keys import ConfigError
from rlloom.core_rl.data.user_code import UserCodeError, load_object, split_spec

__all__ = [
    "BUILTIN_SAMPLERS",
    "EpochSampler",
    "LearnabilitySampler",
    "PromptSampler",
    "SamplerFeedback",
    "check_sampler_config",
    "make_sampler",
    "sampler_class",
]

BUILTIN_SAMPLERS: dict[str, str] = {"learnability": "rlloom.core_rl.data.samplers:LearnabilitySampler"}
"""Short names `data.sampler.class_path` accepts for rlloom's own samplers."""

_REQUIRED = ("next_ids", "state_dict", "load_state_dict")


@dataclass(frozen=True)
class SamplerFeedback:
    """One rollout round's outcome, one entry per sample (a row drawn with `rollout.n` samples appears n times).

    `rewards` are the trajectories' rewards as trained on (DAPO's overlong penalty included; a sample whose scoring
    failed counts 0.0); `components` their named reward parts (e.g. `exact`, `overlong_penalty`).
    """

    step: int
    row_ids: tuple[int, ...]
    rewards: tuple[float, ...]
    components: tuple[Mapping[str, float], ...] = field(default=())


class PromptSampler(Protocol):
    """Which training rows come next (see the module docstring for the contract and the optional methods)."""

    def next_ids(self, active: Sequence[int], *, epoch: int, position: int, count: int) -> Sequence[int]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class EpochSampler:
    """The default: every active row once per epoch, in data order or (with `shuffle`) in a permutation seeded by
    (seed, epoch) — `torch.randperm` with seed `seed * 100_003 + epoch`, the order rlloom always drew. Stateless."""

    def __init__(self, rows: Sequence[Any] = (), *, seed: int = 0, shuffle: bool = True) -> None:
        self.seed = seed
        self.shuffle = shuffle

    def order(self, active: Sequence[int], epoch: int) -> list[int]:
        if not self.shuffle:
            return list(active)
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return [active[i] for i in torch.randperm(len(active), generator=gen).tolist()]

    def next_ids(self, active: Sequence[int], *, epoch: int, position: int, count: int) -> list[int]:
        return self.order(active, epoch)[position : position + count]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class LearnabilitySampler:
    """A curriculum that draws prompts in proportion to their learnability p(1 − p), p being the prompt's running
    pass rate: prompts the policy always or never solves give GRPO-style estimators no signal (every advantage in
    their group is 0) and are drawn rarely; those it solves about half the time most often.

    Learnability as the variance of a 0/1 success is "sampling for learnability" (Rutherford et al. 2024, "No
    Regrets"), applied to LLM reasoning RL as LILO (Foster et al. 2025, "Learning to Reason at the Frontier of
    Learnability", arXiv:2502.12272), which shows the expected policy improvement grows with it. LILO selects
    high-learnability prompts from fresh samples of a large candidate batch; this sampler instead keeps a running
    estimate per prompt, so it costs no extra generation:

    - a sample is solved when its reward >= `solved_threshold`; a round's solve rate for prompt i is s_i (its
      solved samples / its samples in that round);
    - p_i starts at `prior` (0.5: an unseen prompt is taken as maximally learnable, so every prompt gets tried);
      the first observation sets p_i = s_i, later ones p_i ← (1 − ema)·p_i + ema·s_i;
    - w_i = p_i(1 − p_i) + floor (floor > 0 keeps every prompt drawable, so a prompt that was solved once by luck
      can come back); P(i) = w_i / Σ_j w_j over the active rows;
    - a batch is `count` rows drawn without replacement by P (`torch.multinomial`) with a generator seeded by
      (seed, epoch, position): the same state gives the same batch, so a resume continues exactly. Across batches
      rows repeat: an "epoch" here is a count of rows drawn (`len(active)`), not one pass over each row.
    """

    def __init__(
        self,
        rows: Sequence[Any],
        *,
        seed: int = 0,
        prior: float = 0.5,
        ema: float = 0.5,
        floor: float = 0.01,
        solved_threshold: float = 1.0,
    ) -> None:
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior={prior} is not a pass rate in [0, 1]; 0.5 tries every unseen prompt first")
        if not 0.0 < ema <= 1.0:
            raise ValueError(f"ema={ema} must be in (0, 1]; 1 keeps only the latest round's pass rate")
        if not floor > 0.0:
            raise ValueError(f"floor={floor} must be > 0, so prompts with pass rate 0 or 1 can still be drawn")
        self.seed = seed
        self.prior, self.ema, self.floor, self.solved_threshold = prior, ema, floor, solved_threshold
        self.pass_rate = torch.full((len(rows),), float(prior), dtype=torch.float64)
        self.seen = torch.zeros(len(rows), dtype=torch.int64)  # rounds each row was drawn in and fed back

    def probabilities(self, active: Sequence[int]) -> torch.Tensor:
        """P(i) for each row of `active`, in that order."""
        p = self.pass_rate[torch.as_tensor(list(active), dtype=torch.long)]
        weights = p * (1.0 - p) + self.floor
        return weights / weights.sum()

    def next_ids(self, active: Sequence[int], *, epoch: int, position: int, count: int) -> list[int]:
        if count <= 0:
            return []
        gen = torch.Generator().manual_seed(((self.seed * 100_003 + epoch) * 1_000_003 + position) % 2**63)
        picked = torch.multinomial(self.probabilities(active), count, replacement=False, generator=gen)
        return [active[i] for i in picked.tolist()]

    def update(self, feedback: SamplerFeedback) -> None:
        solved: dict[int, list[float]] = defaultdict(list)
        for row, reward in zip(feedback.row_ids, feedback.rewards, strict=True):
            solved[row].append(float(reward >= self.solved_threshold))
        for row, outcomes in solved.items():
            rate = sum(outcomes) / len(outcomes)
            old = float(self.pass_rate[row])
            self.pass_rate[row] = rate if self.seen[row] == 0 else (1.0 - self.ema) * old + self.ema * rate
            self.seen[row] += 1

    def metrics(self) -> dict[str, float]:
        seen = self.seen > 0
        p = self.pass_rate[seen]
        return {
            "data/curriculum/seen_frac": float(seen.float().mean()) if len(seen) else 0.0,
            "data/curriculum/mean_pass_rate": float(p.mean()) if len(p) else self.prior,
            "data/curriculum/learnable_frac": float(((p > 0) & (p < 1)).float().mean()) if len(p) else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"pass_rate": self.pass_rate.tolist(), "seen": self.seen.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if len(state["pass_rate"]) != len(self.pass_rate):
            raise ValueError(
                f"LearnabilitySampler: the checkpoint holds pass rates of {len(state['pass_rate'])} rows, the data "
                f"has {len(self.pass_rate)}"
            )
        self.pass_rate = torch.tensor(state["pass_rate"], dtype=torch.float64)
        self.seen = torch.tensor(state["seen"], dtype=torch.int64)


def sampler_class(class_path: str) -> type:
    """The class `data.sampler.class_path` names (a short name of `BUILTIN_SAMPLERS`, or an import spec), checked
    to have the `PromptSampler` methods; a `ConfigError` naming the field and the fix otherwise."""
    key = "data.sampler.class_path"
    spec = BUILTIN_SAMPLERS.get(class_path, class_path)
    try:
        split_spec(spec)
    except UserCodeError:
        raise ConfigError(
            f"{key}: {class_path!r} is neither a built-in sampler ({', '.join(BUILTIN_SAMPLERS)}) nor "
            "'package.module:Class' / 'path/to/file.py:Class' (veRL's class_path and class_name, joined by ':')"
        ) from None
    try:
        cls = load_object(spec)
    except UserCodeError as err:
        raise ConfigError(f"{key}: {err}") from None
    if not inspect.isclass(cls):
        raise ConfigError(f"{key}: {class_path!r} is a {type(cls).__name__}, not a class; name the sampler class")
    missing = [name for name in _REQUIRED if not callable(getattr(cls, name, None))]
    if missing:
        raise ConfigError(
            f"{key}: {cls.__name__} lacks {', '.join(missing)}; a prompt sampler needs next_ids(active, *, epoch, "
            "position, count), state_dict() and load_state_dict(state) (and update(feedback) for a curriculum; see "
            "rlloom.core_rl.data.samplers)"
        )
    for optional in ("update", "metrics"):
        if hasattr(cls, optional) and not callable(getattr(cls, optional)):
            raise ConfigError(f"{key}: {cls.__name__}.{optional} is not a method")
    return cls


def check_sampler_config(class_path: str | None, kwargs: Mapping[str, Any]) -> None:
    """At config load: the class imports, has the methods, and its constructor takes `(rows, seed=..., **kwargs)`."""
    if class_path is None:
        return
    cls = sampler_class(class_path)
    try:
        inspect.signature(cls).bind([], seed=0, **kwargs)
    except TypeError as err:
        params = ", ".join(str(p) for p in inspect.signature(cls).parameters.values())
        raise ConfigError(
            f"data.sampler.kwargs: {cls.__name__} is built as {cls.__name__}(rows, seed=trainer.seed, "
            f"**data.sampler.kwargs), which its signature ({params}) refuses: {err}; fix the kwargs (or the "
            "constructor)"
        ) from None


def make_sampler(
    class_path: str | None, kwargs: Mapping[str, Any], rows: Sequence[Any], *, seed: int, shuffle: bool
) -> PromptSampler:
    """The run's sampler: `EpochSampler(shuffle=data.shuffle)` without `data.sampler.class_path`, else the class
    named there; a constructor's `ValueError`/`TypeError` becomes a `ConfigError` on `data.sampler.kwargs`."""
    if class_path is None:
        return EpochSampler(rows, seed=seed, shuffle=shuffle)
    cls = sampler_class(class_path)
    try:
        sampler: PromptSampler = cls(rows, seed=seed, **kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"data.sampler.kwargs: {cls.__name__} refused them: {err}") from None
    return sampler
