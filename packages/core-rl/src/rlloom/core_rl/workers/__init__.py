"""The models a run trains and queries: actor, critic, reward model, their forward passes, precision, optimizer,
attention kernels and weight sync; and the supervised warm-up's command (shared settings, flags, checks, load,
train, save).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.workers.supervised import DEFAULT_MICRO_BATCH_TOKENS as DEFAULT_MICRO_BATCH_TOKENS
    from rlloom.core_rl.workers.supervised import supervised_train as supervised_train
    from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer as load_pretrained_tokenizer
    from rlloom.core_rl.workers.warmup_command import WarmupSettingsBase as WarmupSettingsBase
    from rlloom.core_rl.workers.warmup_command import add_settings_arguments as add_settings_arguments
    from rlloom.core_rl.workers.warmup_command import add_warmup_arguments as add_warmup_arguments
    from rlloom.core_rl.workers.warmup_command import check_warmup_flags as check_warmup_flags
    from rlloom.core_rl.workers.warmup_command import run_warmup as run_warmup

_EXPORTS = {
    "DEFAULT_MICRO_BATCH_TOKENS": "supervised",
    "supervised_train": "supervised",
    "load_pretrained_tokenizer": "tokenizer_loading",
    "add_settings_arguments": "warmup_command",
    "add_warmup_arguments": "warmup_command",
    "check_warmup_flags": "warmup_command",
    "run_warmup": "warmup_command",
    "WarmupSettingsBase": "warmup_command",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
