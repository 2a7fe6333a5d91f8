"""rlloom scorers as verifiers reward functions (verifiers >= 0.4, `import verifiers.v1 as vf`).

A verifiers `Task` scores a finished rollout by calling its `@vf.reward` functions, and the functions plugged in
through `TaskConfig.rewards`, with the arguments they name: `task` (the task's `TaskData`) and `trace` (the
rollout). `vf_reward(scorer)` is such a function: it scores `trace.last_reply` against the task data's
`answer` field with an rlloom scorer, off the event loop, and records the score's components as trace metrics
(`<name>/<component>`) and a scoring error in `trace.info["rlloom"]`. Use it as a decorated task attribute,
`accuracy = vf.reward(vf_reward("gsm8k"), weight=1.0)`, or plug it from config by import path;
`registry_reward` (plug `rlloom.rewards.integrations.verifiers:registry_reward`) routes each task by its
`data_source` field. Nothing here imports verifiers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlloom.rewards.integrations.scoring import ScorerLike, resolve, score_async


class VerifiersReward:
    """An async verifiers reward function `(task, trace) -> float` over an rlloom scorer (see `vf_reward`).

    An object rather than a function, so that as a class attribute of a `vf.Task` it is not bound as a method
    (verifiers passes the task data as `task`, by name).
    """

    def __init__(
        self,
        scorer: ScorerLike | None = None,
        *,
        name: str | None = None,
        answer_field: str = "answer",
        data_source_field: str = "data_source",
        extra_info_field: str = "extra_info",
    ) -> None:
        if isinstance(scorer, str):
            resolve(scorer, None, how="")  # an unknown name fails at import, not in the first rollout
        self.scorer = scorer
        self.answer_field = answer_field
        self.data_source_field = data_source_field
        self.extra_info_field = extra_info_field
        if scorer is None:
            default = "by_data_source"
        else:
            default = scorer if isinstance(scorer, str) else getattr(scorer, "__name__", type(scorer).__name__)
        self._named = name is not None
        self.__name__ = name or f"rlloom_{str(default).rsplit(':', 1)[-1].rsplit('/', 1)[-1]}"
        self.__doc__ = f"rlloom scorer {default!r} on the last reply against the task's {answer_field!r}."

    def __set_name__(self, owner: type, name: str) -> None:
        """As a `vf.Task` class attribute, the reward takes the attribute's name (its key in `trace.rewards`)."""
        if not self._named:
            self.__name__ = name

    async def __call__(self, task: Any, trace: Any) -> float:
        if not hasattr(task, self.answer_field):
            fields = sorted(getattr(type(task), "model_fields", {})) or sorted(vars(task))
            raise AttributeError(
                f"{self.__name__}: the task data has no {self.answer_field!r} field (its fields: {fields}); add it "
                f"to your vf.TaskData subclass or pass vf_reward(..., answer_field='<your field>')"
            )
        ground_truth = getattr(task, self.answer_field)
        source = getattr(task, self.data_source_field, None)
        how = f"pass vf_reward(scorer=...) or give the task data a {self.data_source_field!r} field"
        fn, name = resolve(self.scorer, source, how=how)
        extra = getattr(task, self.extra_info_field, None)
        result = await score_async(
            fn, name, trace.last_reply or "", ground_truth, extra if isinstance(extra, Mapping) else None
        )
        if result.components and hasattr(trace, "record_metrics"):
            trace.record_metrics({f"{self.__name__}/{k}": v for k, v in result.components.items()})
        info = getattr(trace, "info", None)
        if isinstance(info, dict) and (result.error or result.extracted is not None):
            info.setdefault("rlloom", {})[self.__name__] = {"error": result.error, "extracted": result.extracted}
        return result.score


def vf_reward(
    scorer: ScorerLike | None = None,
    *,
    name: str | None = None,
    answer_field: str = "answer",
    data_source_field: str = "data_source",
    extra_info_field: str = "extra_info",
) -> VerifiersReward:
    """A verifiers reward function scoring with `scorer` (a registry name such as "gsm8k", "module:function", a
    `Rubric` or any scorer callable), or with the registry scorer of the task's `data_source` field when None.

    `name` is the reward's key in `trace.rewards` and the prefix of its component metrics; by default the class
    attribute it is assigned to, else `rlloom_<scorer>` (plugged from config, the entry's key names the reward,
    the metrics keep this name).
    """
    return VerifiersReward(
        scorer,
        name=name,
        answer_field=answer_field,
        data_source_field=data_source_field,
        extra_info_field=extra_info_field,
    )


registry_reward = vf_reward(name="rlloom_registry")
"""Plug by path (`rlloom.rewards.integrations.verifiers:registry_reward`): each task scored by its
`data_source` field's registry scorer against its `answer` field."""
