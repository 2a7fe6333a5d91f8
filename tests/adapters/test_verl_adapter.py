"""`rlloom.rewards.integrations.verl.compute_score` loaded by veRL itself: veRL's own trainer config
(`ppo_trainer.yaml`, composed by hydra as `main_ppo` does) names it in `reward.custom_reward_function`, veRL's
`RewardLoopWorker` (the class its trainer runs as a Ray actor; here in-process) loads it through
`load_reward_manager`, and its naive reward manager decodes each response and calls it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from verl import DataProto
from verl.experimental.reward_loop import RewardLoopWorker, migrate_legacy_reward_impl
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.ray_utils import get_event_loop

import rlloom.rewards.integrations.verl as rlloom_verl
from rlloom.rewards.registry import ScorerLoadError

CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
PKG = "pkg://rlloom.rewards.integrations.verl"


def verl_config(tokenizer_dir: Path, *overrides: str) -> Any:
    """veRL's PPO trainer config with `overrides`, migrated as veRL's entry points migrate it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose(
            config_name="ppo_trainer", overrides=[f"actor_rollout_ref.model.path={tokenizer_dir}", *overrides]
        )
    return migrate_legacy_reward_impl(config)


def batch(tok: Any, rows: list[dict[str, Any]]) -> DataProto:
    """A rollout batch as veRL's trainer hands it to the reward loop: right-padded response ids, the attention
    mask over prompt + response, and the parquet row's non-tensor fields."""
    prompt_len, response_len = 4, 48
    prompts = torch.full((len(rows), prompt_len), tok.pad_token_id)
    responses = torch.full((len(rows), response_len), tok.pad_token_id)
    mask = torch.zeros((len(rows), prompt_len + response_len), dtype=torch.long)
    mask[:, :prompt_len] = 1
    for i, row in enumerate(rows):
        ids = tok(row["response"], add_special_tokens=False)["input_ids"][:response_len]
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, prompt_len : prompt_len + len(ids)] = 1
    non_tensors = {
        "data_source": np.array([r["data_source"] for r in rows], dtype=object),
        "reward_model": np.array([{"ground_truth": r["ground_truth"]} for r in rows], dtype=object),
        "extra_info": np.array([dict(r.get("extra_info", {})) for r in rows], dtype=object),
    }
    tensors = {"prompts": prompts, "responses": responses, "attention_mask": mask}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def scores_through_verl(config: Any, data: DataProto) -> list[dict[str, Any]]:
    loop = get_event_loop()  # veRL's reward managers capture the loop they run their executor calls on
    worker = RewardLoopWorker(config)
    return loop.run_until_complete(worker.compute_score_batch(data))


NQ_GOLD = {"target": np.array(["paris"])}
ROWS = [
    # veRL's GSM8K rows: data_source "openai/gsm8k", ground truth the number, "#### n" answers
    {"response": "3 + 1 = 4 #### 4", "data_source": "openai/gsm8k", "ground_truth": "4"},
    {"response": "#### 5", "data_source": "openai/gsm8k", "ground_truth": "4"},
    # Search-R1's rows: data_source "searchR1_nq", ground truth {"target": [...]} (a numpy array in parquet)
    {
        "response": "<answer>Paris</answer>",
        "data_source": "searchR1_nq",
        "ground_truth": {"target": np.array(["paris"])},
    },
    {
        "response": "<answer>Lyon</answer>",
        "data_source": "searchR1_nq",
        "ground_truth": {"target": np.array(["paris"])},
    },
    {"response": "so \\boxed{\\frac{1}{2}}", "data_source": "lighteval/MATH", "ground_truth": "0.5"},
]


@pytest.fixture
def tokenizer_dir(tmp_path: Path, char_tokenizer: Any) -> Path:
    char_tokenizer.save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def test_verl_trainer_config_loads_and_calls_compute_score(tokenizer_dir: Path, char_tokenizer: Any) -> None:
    config = verl_config(
        tokenizer_dir, f"reward.custom_reward_function.path={PKG}", "reward.custom_reward_function.name=compute_score"
    )
    outputs = scores_through_verl(config, batch(char_tokenizer, ROWS))
    assert [o["reward_score"] for o in outputs] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [o["reward_extra_info"]["acc"] for o in outputs] == [1.0, 0.0, 1.0, 0.0, 1.0]  # veRL's float form


def test_legacy_top_level_config_by_file_path_with_reward_kwargs(tokenizer_dir: Path, char_tokenizer: Any) -> None:
    """Older veRL configs name a file in the top-level `custom_reward_function`; veRL migrates it. reward_kwargs
    reach compute_score: `scorers` reroutes one source, `components` returns the dict form with its parts."""
    config = verl_config(
        tokenizer_dir,
        f"custom_reward_function.path={rlloom_verl.__file__}",
        "custom_reward_function.name=compute_score",
        "+custom_reward_function.reward_kwargs.components=true",
        "+custom_reward_function.reward_kwargs.scorers.searchR1_nq=qa_f1",
    )
    rows = [
        {"response": "<answer>the city of Paris</answer>", "data_source": "searchR1_nq", "ground_truth": ["Paris"]},
        {"response": "<answer>Lyon</answer>", "data_source": "searchR1_nq", "ground_truth": ["Paris"]},
    ]
    outputs = scores_through_verl(config, batch(char_tokenizer, rows))
    # token F1 of "city of paris" against "paris" after SQuAD normalisation: P = 1/3, R = 1, F1 = 0.5
    assert outputs[0]["reward_score"] == pytest.approx(0.5)
    assert outputs[0]["reward_extra_info"]["em"] == 0.0
    assert outputs[0]["reward_extra_info"]["f1"] == pytest.approx(0.5)
    assert outputs[1]["reward_score"] == 0.0
    assert sorted(outputs[0]["reward_extra_info"]) == sorted(outputs[1]["reward_extra_info"])  # veRL needs same keys


def test_main_eval_positional_call_and_errors(tokenizer_dir: Path) -> None:
    config = verl_config(
        tokenizer_dir, f"reward.custom_reward_function.path={PKG}", "reward.custom_reward_function.name=compute_score"
    )
    fn = get_custom_reward_fn(config)
    assert fn("openai/gsm8k", "#### 4", "4") == 1.0  # veRL's main_eval passes three positional arguments
    with pytest.raises(ScorerLoadError, match=r"data_source 'my_dataset' has no rlloom scorer.*reward_kwargs.scorer"):
        fn("my_dataset", "#### 4", "4")


def test_a_raising_scorer_scores_zero_and_warns_once(tokenizer_dir: Path, tmp_path: Path, caplog: Any) -> None:
    scorer_file = tmp_path / "my_scorer.py"
    scorer_file.write_text("def score(response, ground_truth, *, extra_info=None):\n    raise KeyError('label')\n")
    config = verl_config(
        tokenizer_dir,
        f"reward.custom_reward_function.path={PKG}",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs.scorer={scorer_file}:score",
    )
    fn = get_custom_reward_fn(config)
    with caplog.at_level("WARNING", logger="rlloom.rewards.integrations.verl"):
        assert [fn(data_source="x", solution_str="a", ground_truth="b", extra_info=None) for _ in range(3)] == [0.0] * 3
    warnings = [r for r in caplog.records if "scored a x response 0: KeyError" in r.getMessage()]
    assert len(warnings) == 1
