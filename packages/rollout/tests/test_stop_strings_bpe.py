"""Stop strings that span several multi-character tokens, with a BPE tokenizer trained in-process.

The character tokenizer maps one token to one character, which hides the hard case: a stop string such as
`</search>` starting inside one token and ending inside another. The expected ids and text are found by brute
force over prefixes of the unstopped sample, independently of the engine's incremental detokeniser.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine
from rlloom.rollout.hf.stopping import StopStringWatcher, TokenPieces, find_stop

CORPUS = [
    "<search> capital of France </search> <answer> Paris </answer>",
    "<think> the user asks about search engines </think> <search> who wrote Hamlet </search>",
    "searching for answers: the answer is 42, search again",
] * 20


def _byte_level_bpe(corpus: list[str], vocab_size: int, **trainer_options: Any) -> PreTrainedTokenizerFast:
    """GPT-2/Qwen style: byte-level BPE trained in-process, so multi-byte characters split over tokens."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<eos>", "<unk>"], show_progress=False, **trainer_options
    )
    backend.train_from_iterator(corpus, trainer)
    return _fast(backend)


def _fast(backend: Tokenizer) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def bpe() -> PreTrainedTokenizerFast:
    return _byte_level_bpe(CORPUS, 300)


def _minimal_prefix(tok: Any, ids: list[int], stop: str) -> int:
    return next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k], skip_special_tokens=True))


def test_multi_token_stop_string_cut(bpe: PreTrainedTokenizerFast) -> None:
    engine = HFEngine(tiny_qwen2(bpe, seed=1), bpe)
    prompt = list(bpe("<search> who", add_special_tokens=False)["input_ids"])
    full = engine.generate(
        [GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(seed=9, max_tokens=40, ignore_eos=True))]
    )[0][0]
    pieces = [bpe.decode([t]) for t in full.token_ids]
    # a stop string from the middle of one multi-character token to the middle of a later one
    starts = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    i = next(i for i in range(2, len(pieces) - 3) if len(pieces[i]) >= 2 and len(pieces[i + 2]) >= 2)
    stop = full.text[starts[i] + 1 : starts[i + 2] + 1]
    k = _minimal_prefix(bpe, full.token_ids, stop)
    at = full.text.find(stop)
    got = engine.generate(
        [
            GenerationRequest(
                prompt_ids=prompt, sampling=SamplingParams(seed=9, max_tokens=40, ignore_eos=True, stop=[stop])
            )
        ]
    )[0][0]
    assert got.token_ids == full.token_ids[:k]
    assert got.text == full.text[: at + len(stop)]
    assert got.finish_reason == "stop" and got.stop_reason == stop
    assert len(bpe.decode(got.token_ids)) > len(got.text)  # the last token ran past the stop text
    engine.close()


def test_watcher_matches_brute_force_on_every_prefix(bpe: PreTrainedTokenizerFast) -> None:
    text = "<think> x </think> <search> capital of France </search> tail"
    ids = list(bpe(text, add_special_tokens=False)["input_ids"])
    for stop in ["</search>", "</think>", "France </", "h> c", "tail"]:
        watcher = StopStringWatcher(bpe, [stop])
        fired = next(k for k, t in enumerate(ids, start=1) if watcher.push(t))
        assert fired == _minimal_prefix(bpe, ids, stop), stop


def test_find_stop_prefers_the_earliest_end() -> None:
    m = find_stop("abc </search> </answer>", ["</answer>", "</search>"])
    assert m is not None and m.stop == "</search>" and m.start == 4
    assert find_stop("nothing here", ["</x>"]) is None


MULTILINGUAL = [
    "<search> Zürich café naïve </search> <answer> 東京 </answer>",
    "straße → Ελληνικά, emoji 🙂🚀 and «quotes» <think> ok </think>",
    "plain ascii text: the answer is 42. done.",
] * 20


def _sentencepiece_style() -> PreTrainedTokenizerFast:
    """Llama style: Metaspace word boundaries and byte fallback (`<0xE2>`-like tokens) for unseen characters."""
    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>", "<unk>", *[f"<0x{b:02X}>" for b in range(256)]],
        show_progress=False,
    )
    backend.train_from_iterator(MULTILINGUAL[:1] * 5 + MULTILINGUAL[2:3] * 5, trainer)
    return _fast(backend)


def _multilingual_byte_level() -> PreTrainedTokenizerFast:
    return _byte_level_bpe(MULTILINGUAL, 400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


@pytest.mark.parametrize("make", [_multilingual_byte_level, _sentencepiece_style], ids=["byte-level", "sentencepiece"])
def test_skipping_tokens_that_cannot_complete_a_stop_fires_at_the_same_step(make: Any) -> None:
    # The shortcut must never change when a stop fires: compare against the watcher that decodes at every
    # token, on real texts (stops cut from them, across token seams and inside multi-byte characters) and on
    # random token streams (ids whose bytes do not form valid UTF-8).
    tok = make()
    pieces = TokenPieces(tok)
    rng = random.Random(0)
    vocab = len(tok)
    streams = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in MULTILINGUAL[:3]]
    streams += [[rng.randrange(vocab) for _ in range(60)] for _ in range(40)]
    checked = fired = 0
    for ids in streams:
        text = tok.decode(ids, skip_special_tokens=True)
        candidates = [text[i : i + n] for n in (1, 2, 3, 5) for i in range(0, max(1, len(text) - n), 3)]
        for stops in [[c] for c in candidates if c.strip()] + [["</search>", "</answer>"], ["🚀"], ["é"]]:
            eager = StopStringWatcher(tok, stops)
            lazy = StopStringWatcher(tok, stops, pieces=pieces)
            want = next((k for k, t in enumerate(ids) if eager.push(t)), None)
            got = next((k for k, t in enumerate(ids) if lazy.push(t)), None)
            assert got == want, (stops, ids)
            checked += 1
            fired += want is not None
    assert checked > 500 and fired > checked // 2  # the comparison is not vacuous


def test_stops_ending_in_whitespace_are_checked_at_every_token(bpe: PreTrainedTokenizerFast) -> None:
    watcher = StopStringWatcher(bpe, ["answer "], pieces=TokenPieces(bpe))
    assert watcher.pieces is None
