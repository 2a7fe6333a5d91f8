"""Turning a prompt into token ids, the same way for every in-process engine and for the trainer's length limit.

Chat messages are rendered with the tokenizer's own chat template (with the assistant generation prompt) and
encoded without extra special tokens, so the ids are exactly what the template says; token-id prompts pass
through untouched. The trainer counts prompts with the same function the engines use, so a row that passes
`data.max_prompt_length` is exactly as long as what the engine will prefill.
"""

from __future__ import annotations

from typing import Any

from rlloom.core_rl.contracts.generation import GenerationRequest


def render_prompt(tokenizer: Any, request: GenerationRequest) -> list[int]:
    """The request's prompt as token ids, rendering chat messages with the tokenizer's chat template."""
    if request.prompt_ids is not None:
        return list(request.prompt_ids)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"request {request.request_id}: `messages` given but the tokenizer has no chat template; "
            "set tokenizer.chat_template or send `prompt_ids`."
        )
    text = tokenizer.apply_chat_template(
        request.messages, tokenize=False, add_generation_prompt=True, **request.chat_template_kwargs
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"request {request.request_id}: `messages` rendered to an empty prompt")
    return list(ids)
