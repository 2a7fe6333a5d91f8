"""A veRL `compute_score` backed by rlloom's data-source registry, for veRL's `custom_reward_function`.

veRL's reward managers call `compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`
once per response, merged with the config's `reward_kwargs` (and, for some managers, extra keywords such as
`reward_router_address`, ignored here); its offline `main_eval` calls it positionally with three arguments.
Point veRL at this module (veRL >= 0.7 reads `reward.custom_reward_function`, older versions the top-level
`custom_reward_function`; both accept a file path, newer ones also `pkg://module`):

    reward.custom_reward_function.path=pkg://rlloom.rewards.integrations.verl
    reward.custom_reward_function.name=compute_score

Each row is scored by the rlloom scorer of its `data_source` ("openai/gsm8k", "searchR1_nq", "lighteval/MATH",
... as `rlloom.rewards.registry` maps them), or by `reward_kwargs.scorer` for every row, or
`reward_kwargs.scorers[data_source]` per source. A data_source with no scorer raises (a misnamed dataset would
otherwise train on zeros); a scorer that raises or reports an error scores 0 and is logged once per source and
error kind. `reward_kwargs.components: true` returns veRL's dict form, `{"score": ..., <component>: ...}`, whose
extra keys veRL logs; every row of a batch must then report the same components (one scorer per run, or a Rubric).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rlloom.rewards.integrations.scoring import resolve, score_now

logger = logging.getLogger(__name__)
_WARNED: set[tuple[str, str]] = set()
_HOW = (
    "set reward_kwargs.scorer ('module:function' or a registry name) for every row, or reward_kwargs.scorers "
    "= {data_source: scorer}"
)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    scorer: str | None = None,
    scorers: Mapping[str, str] | None = None,
    components: bool = False,
    **_ignored: Any,
) -> float | dict[str, float]:
    """The reward of one veRL response (see the module docstring for the routing and the keyword options)."""
    choice = scorer
    if scorers is not None and data_source in scorers:
        choice = scorers[data_source]
    fn, name = resolve(choice, str(data_source) if data_source is not None else None, how=_HOW)
    info = extra_info if isinstance(extra_info, Mapping) else None
    result = score_now(fn, name, solution_str, ground_truth, info)
    if result.error is not None:
        kind = str(result.details.get("error_kind") or result.error.split(":", 1)[0])[:80]
        if (name, kind) not in _WARNED:
            _WARNED.add((name, kind))
            logger.warning("rlloom scorer %r scored a %s response 0: %s", name, data_source, result.error[:500])
    if not components:
        return result.score
    return {"score": result.score, **result.components}
