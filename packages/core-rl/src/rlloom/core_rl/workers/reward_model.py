"""A learned reward model (a sequence classifier with one output, trained on preferences) as the trainer's reward.

RLHF's reward: veRL's `reward_model.enable`, OpenRLHF's `--reward_pretrain`, TRL's PPO `reward_model`. The
policy's prompt and response are rendered again with the reward model's own chat template (as veRL does when the
two tokenizers differ), from the prompt's chat messages when the trajectory kept them, else as the prompt text
(decoded with `policy_tokenizer` when only ids were kept) followed by the response; batches are right-padded
and scored in `batch_size` chunks with no gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerBase

from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer


class RewardModel:
    """`RewardFn` over a local Hugging Face sequence-classification checkpoint with `num_labels=1`.

    The score is the model's output; `scale` and `shift` map it (score = scale * output + shift), and it is
    logged as the `component` reward component. Inputs longer than `max_length` tokens keep their end (the
    response), as the reward is about it.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        tokenizer_path: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 16,
        max_length: int | None = None,
        scale: float = 1.0,
        shift: float = 0.0,
        component: str = "reward_model",
        policy_tokenizer: PreTrainedTokenizerBase | None = None,
        progress: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.tokenizer: PreTrainedTokenizerBase = load_pretrained_tokenizer(tokenizer_path or path)
        self.model = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=dtype)
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"{path}: a reward model has one output (num_labels=1), this one has {self.model.config.num_labels}; "
                "load a Bradley-Terry reward model (e.g. trained with TRL's RewardTrainer)"
            )
        # the classifier reads each row's score at its last token that is not the config's pad id, so rows are
        # padded with that id (a tokenizer's own pad id may differ from it), or the tokenizer's when it has none
        text_config = self.model.config.get_text_config()
        pad = text_config.pad_token_id
        for fallback in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            pad = fallback if pad is None else pad
        if pad is None:
            raise ValueError(f"{tokenizer_path or path}: the tokenizer has neither a pad nor an EOS token to pad with")
        self.pad_token_id = int(pad)
        text_config.pad_token_id = self.pad_token_id
        self.device = torch.device(device)
        self.model.to(self.device).eval()
        self.batch_size = batch_size
        self.max_length = max_length
        self.scale, self.shift, self.component = scale, shift, component
        self.progress = progress
        self.policy_tokenizer = policy_tokenizer

    def text(self, trajectory: Trajectory) -> str:
        """The reward model's input: the conversation in its own chat template when it has one."""
        response = trajectory.response_text
        if trajectory.prompt_messages and getattr(self.tokenizer, "chat_template", None):
            messages = [*trajectory.prompt_messages, {"role": "assistant", "content": response}]
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False))
        if trajectory.prompt_text:
            return trajectory.prompt_text + response
        if self.policy_tokenizer is None:
            raise ValueError(
                "RewardModel: the trajectory kept neither its chat messages nor its prompt text (a prompt given as "
                "token ids); pass policy_tokenizer= so the prompt can be decoded"
            )
        prompt = self.policy_tokenizer.decode(trajectory.prompt_ids, skip_special_tokens=False)
        return str(prompt) + response

    def scores(self, texts: Sequence[str]) -> list[float]:
        """The model's output for each text (no scale or shift)."""
        out: list[float] = []
        starts = range(0, len(texts), self.batch_size)
        for start in tqdm(starts, desc="reward model", disable=not self.progress):
            chunk = [self._ids(t) for t in texts[start : start + self.batch_size]]
            width = max(len(ids) for ids in chunk)
            input_ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(chunk):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention[row, : len(ids)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device))
            out += logits.logits[:, 0].float().cpu().tolist()
        return out

    def _ids(self, text: str) -> list[int]:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError("the reward model's input rendered to zero tokens")
        return ids[-self.max_length :] if self.max_length else ids

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
        raw = self.scores([self.text(t) for t in trajectories])
        return [
            RewardOutput(score=self.scale * r + self.shift, components={self.component: self.scale * r + self.shift})
            for r in raw
        ]
