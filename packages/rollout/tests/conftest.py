"""Shared fixtures: the tiny in-process Qwen2 model and character tokenizer from core-rl."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine

sys.path.insert(0, str(Path(__file__).parent))  # vllm_sync_checks.py: helpers the vLLM test files share


@pytest.fixture(scope="session")
def tok() -> Any:
    return char_tokenizer()


@pytest.fixture
def model(tok: Any) -> torch.nn.Module:
    m = tiny_qwen2(tok, seed=0)
    m.eval()
    return m


@pytest.fixture
def engine(model: torch.nn.Module, tok: Any) -> Iterator[HFEngine]:
    eng = HFEngine(model, tok)
    yield eng
    eng.close()


def _peaked_state(tok: Any, seed: int) -> dict[str, torch.Tensor]:
    """Weights of another tiny model with embeddings scaled up, so its next-token distributions are sharp.

    A freshly initialised model is nearly uniform over the vocabulary, so the same seed samples the same
    tokens from almost any such weights; sharp ones make a weight change visible in the text.
    """
    state = {k: v.clone() for k, v in tiny_qwen2(tok, seed=seed).state_dict().items() if k != "lm_head.weight"}
    state["model.embed_tokens.weight"] *= 40.0
    return state


@pytest.fixture
def peaked_state() -> Any:
    """`peaked_state(tok, seed)`: sharp weights of another tiny model (see `_peaked_state`)."""
    return _peaked_state


@pytest.fixture
def encode(tok: Any) -> Any:
    def _encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    return _encode


def _signalling_server_class() -> Any:
    import threading

    import uvicorn

    class SignallingServer(uvicorn.Server):
        """uvicorn's server, setting `ready` once its start-up has finished or failed (tests wait on it)."""

        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            self.ready = threading.Event()

        async def startup(self, sockets: Any = None) -> None:
            try:
                await super().startup(sockets=sockets)
            finally:
                self.ready.set()

    return SignallingServer


class ServerThread:
    """A real uvicorn server on 127.0.0.1 and a free port, run in a background thread of the test process."""

    def __init__(self, app: Any) -> None:
        import socket
        import threading

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = _signalling_server_class()(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        if not self.server.ready.wait(timeout=30) or not self.server.started:
            raise RuntimeError("uvicorn did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def server_thread() -> type[ServerThread]:
    """`server_thread(app)`: a `ServerThread` (context manager) for an app other than `served`'s."""
    return ServerThread


@pytest.fixture
def served(engine: HFEngine, tok: Any) -> Iterator[ServerThread]:
    from rlloom.rollout.openai.server import create_app

    with ServerThread(create_app(engine, "tiny", tok, default_max_tokens=16)) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The tiny test models run fastest on one intra-op thread (more only adds contention on shared CPUs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# SmolLM2-135M-Instruct's shape: 30 layers, 3 KV heads of 64, fp32 on disk (538,090,408 bytes), 8192 positions
SMOLLM2 = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "hidden_size": 576, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
           "max_position_embeddings": 8192, "torch_dtype": "float32"}  # fmt: skip


@pytest.fixture
def smollm2_folder(tmp_path: Path) -> Path:
    """A model folder with SmolLM2-135M's config and a sparse weights file of its real size (only sizes are read)."""
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    with (tmp_path / "model.safetensors").open("wb") as f:
        f.truncate(538_090_408)
    return tmp_path
