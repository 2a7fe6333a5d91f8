"""The models a run trains and queries: actor, critic, reward model, their forward passes, precision, optimizer,
attention kernels and weight sync.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.workers.supervised import supervised_train as supervised_train
    from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer as load_pretrained_tokenizer

_EXPORTS = {
    "supervised_train": "supervised",
    "load_pretrained_tokenizer": "tokenizer_loading",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
