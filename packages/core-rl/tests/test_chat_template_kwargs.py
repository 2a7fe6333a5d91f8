"""data.apply_chat_template_kwargs: template variables (Qwen3's enable_thinking) in every place a prompt is
rendered: the engine's request, validation, and the prompt-length check."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.data.loader import DataError, generation_request
from rlloom.core_rl.phases.collection import single_turn_collector
from rlloom.core_rl.tiny import CHATML_TEMPLATE, char_tokenizer
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

# ChatML, plus Qwen3's switch: with enable_thinking false the generation prompt opens an empty think block
THINKING_TEMPLATE = CHATML_TEMPLATE.replace(
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}",
)


def test_render_prompt_passes_the_template_variables() -> None:
    tok = char_tokenizer()
    tok.chat_template = THINKING_TEMPLATE
    row = {"prompt": "1+2="}
    plain = tok.decode(render_prompt(tok, generation_request(row, SamplingParams())))
    assert plain == "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    quiet = generation_request(row, SamplingParams(), {"enable_thinking": False})
    assert tok.decode(render_prompt(tok, quiet)) == plain + "<think>\n\n</think>\n\n"
    ids_row = {"prompt_ids": [5, 6]}  # token ids are sent as they are
    assert render_prompt(tok, generation_request(ids_row, SamplingParams(), {"enable_thinking": False})) == [5, 6]


def test_reserved_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="add_generation_prompt cannot be set there"):
        GenerationRequest(
            messages=[{"role": "user", "content": "x"}], chat_template_kwargs={"add_generation_prompt": 0}
        )


def test_template_variables_and_loss_settings_can_be_set_one_by_one_as_in_verl(tmp_path: Path) -> None:
    """veRL sets them as `+data.apply_chat_template_kwargs.enable_thinking=False`; the Hydra-prefix error tells
    users to drop the `+`, so the dotted form must then work, added to the ones the YAML file gives."""
    from rlloom.core_rl.config.loading import load_config
    from rlloom.core_rl.config.schema import ConfigError

    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("model:\n  path: /m\ndata:\n  apply_chat_template_kwargs:\n    custom: 1\n")
    cfg = load_config(yaml_file, ["data.apply_chat_template_kwargs.enable_thinking=false"])
    assert cfg.data.apply_chat_template_kwargs == {"custom": 1, "enable_thinking": False}
    with pytest.raises(ConfigError, match="drop|every key exists"):
        load_config(yaml_file, ["+data.apply_chat_template_kwargs.enable_thinking=false"])
    with pytest.raises(ConfigError, match="add_generation_prompt cannot be set there"):
        load_config(yaml_file, ["data.apply_chat_template_kwargs.add_generation_prompt=true"])
    # the same for a loss's settings, which veRL keeps under actor.policy_loss
    loss = load_config(yaml_file, ["algorithm.policy_loss.name=clip_cov", "algorithm.policy_loss.kwargs.clip_cov_ub=4"])
    assert loss.algorithm.policy_loss.kwargs == {"clip_cov_ub": 4.0}
    with pytest.raises(ConfigError, match="here it is algorithm.policy_loss.kwargs, one entry per setting"):
        load_config(yaml_file, ["actor_rollout_ref.actor.policy_loss.clip_cov_ub=4"])
    # veRL's loss_mode is an alias of algorithm.policy_loss on the command line (issue 29)
    aliased = load_config(yaml_file, ["actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov"])
    assert aliased.algorithm.policy_loss.name == "clip_cov"
    with pytest.raises(ConfigError, match="'data.max_prompt_length' is a value, not a section"):
        load_config(yaml_file, ["data.max_prompt_length.x=1"])


def test_the_trainer_renders_and_measures_prompts_with_the_variables(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    tok = load_pretrained_tokenizer(model_dir)
    tok.chat_template = THINKING_TEMPLATE
    tok.save_pretrained(model_dir)
    rows = sum_rows(3, seed=5)
    plain_length = len(render_prompt(tok, generation_request(rows[0], SamplingParams())))
    quiet = ["data.apply_chat_template_kwargs={enable_thinking: false}"]

    def trainer(overrides: list[str], out: str) -> Trainer:
        return Trainer(
            tiny_config(model_dir, tmp_path / out, [*quiet, *overrides]),
            engine=SamplingEngine(model_dir),
            reward_fn=digit_reward,
            train_data=sum_rows(8),
            val_data=rows,
        )

    validation = tmp_path / "val"
    trainer([f"trainer.validation_data_dir={validation}"], "run").validate()
    prompts = (validation / "0.jsonl").read_text().splitlines()
    assert len(prompts) == 3 and all("<think>\\n\\n</think>\\n\\n" in line for line in prompts)
    # the length check renders as the engine does: the think block (19 characters) makes every prompt longer
    think = len(tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"])
    assert think == 19
    with pytest.raises(DataError, match=f"train row 1 of 8: the prompt is {plain_length + think} tokens"):
        trainer([f"data.max_prompt_length={plain_length}"], "limited")


class DeclaringCollector:
    """A custom collector (single-turn underneath) that says which template variables it renders with."""

    def __init__(self, engine: SamplingEngine, chat_template_kwargs: dict[str, object]) -> None:
        self.chat_template_kwargs = chat_template_kwargs
        self.inner = single_turn_collector(engine, chat_template_kwargs)

    def __call__(self, rows: Any, sampling: Any, prefix: str) -> Any:
        return self.inner(rows, sampling, prefix)


def test_a_collector_rendering_other_variables_than_the_data_config_is_refused(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    quiet = ["data.apply_chat_template_kwargs={enable_thinking: false}"]
    engine = SamplingEngine(tiny_model_dir)

    def trainer(collect: Any, out: str) -> Trainer:
        return Trainer(
            tiny_config(tiny_model_dir, tmp_path / out, quiet),
            engine=engine,
            reward_fn=digit_reward,
            train_data=sum_rows(8),
            collect=collect,
        )

    with pytest.raises(ConfigError, match=r"data.apply_chat_template_kwargs: \{'enable_thinking': False\} differs"):
        trainer(DeclaringCollector(engine, {}), "a")
    trainer(DeclaringCollector(engine, {"enable_thinking": False}), "b")  # the same variables: accepted
    with caplog.at_level("WARNING"):
        trainer(single_turn_collector(engine), "c")  # declares nothing: it cannot be checked, so it is said
    assert "reaches the prompt-length check only" in caplog.text
