"""The demo's synthetic world: made-up names with secret codes that only a search can reveal.

Each name is two made-up syllables ("zor bak"); a corpus passage per name says "zor bak has code 42". A question
asks for a name's code, and codes are random, so a model can only answer held-out names (never seen in training)
by searching the name and copying the code from the passage. Syllables and codes are single tokens of a word
tokenizer, so the tiny model's copying is within reach; the held-out names are new pairs of known syllables.

`Demonstrator` writes warm-up conversations through `AgentLoop`: in `search_share` of them it searches the
question's name and answers with Doc 1's code, in the rest it guesses a code. A model warmed up on them searches
now and then, mostly guesses, and answers held-out names (greedy) almost never: GRPO has to find out from the
reward alone that searching pays.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlloom.agent import SearchEnvConfig
from rlloom.agent.envs.search import SEARCH_R1_INVALID_ACTION
from rlloom.core_rl.contracts import Completion, GenerationRequest

TEMPLATE = "Look up with <search> name </search> , reply with <answer> code </answer> . Code of {question}"
ENV_CONFIG = SearchEnvConfig(template=TEMPLATE, top_k=1)
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
CODES = [str(c) for c in range(10, 100)]
_TAGS = ["<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>"]
_NAME_IN_QUESTION = re.compile(r"Code of ([a-z]+ [a-z]+)")
_CODE_IN_PASSAGE = re.compile(r"has code (\d+)")
_GLUE = ["Doc", "1", "2", "3", "(", ")", "Title", ":", '"', "has", "code", ".", ",", "?", "user", "assistant", "system"]


@dataclass(frozen=True)
class World:
    """Names, their codes and the train / held-out split (disjoint name sets)."""

    syllables: list[str]
    codes: dict[str, str]
    train_names: list[str]
    held_out_names: list[str]

    def rows(self, names: Sequence[str]) -> list[dict[str, Any]]:
        return [{"question": n, "answer": [self.codes[n]], "data_source": "synthetic"} for n in names]

    def corpus(self) -> list[dict[str, str]]:
        names = [*self.train_names, *self.held_out_names]
        return [{"_id": str(i), "title": n, "text": f"{n} has code {self.codes[n]}."} for i, n in enumerate(names)]

    def vocabulary(self) -> list[str]:
        """Every word the demo's prompts, passages and answers use (the corrective text's words too)."""
        template_words = TEMPLATE.replace("{question}", "").split()
        corrective = SEARCH_R1_INVALID_ACTION.replace(".", " ").replace(",", " ").split()
        return [*_TAGS, *_GLUE, *template_words, *corrective, *self.syllables, *CODES]


def make_world(seed: int = 0, *, syllables: int = 40, names: int = 400, held_out: int = 80) -> World:
    """A reproducible world: `names` two-syllable names, `held_out` of them kept out of training.

    No two names share both syllables ("zor bak" and "bak zor" would tie for a bag-of-words retriever such as
    BM25), so searching a name always ranks its own passage first.
    """
    if not 0 < held_out < names <= syllables * (syllables - 1) // 2:
        raise ValueError(
            f"need 0 < held_out < names <= syllables * (syllables - 1) / 2, got held_out={held_out}, names={names}, "
            f"syllables={syllables}"
        )
    rng = random.Random(seed)
    pool: set[str] = set()
    while len(pool) < syllables:
        pool.add(rng.choice(CONSONANTS) + rng.choice(VOWELS) + rng.choice(CONSONANTS))
    sylls = sorted(pool)
    chosen: dict[frozenset[str], str] = {}
    while len(chosen) < names:
        first, second = rng.sample(sylls, 2)
        chosen.setdefault(frozenset((first, second)), f"{first} {second}")
    ordered = sorted(chosen.values())
    rng.shuffle(ordered)
    codes = {n: rng.choice(CODES) for n in ordered}
    return World(sylls, codes, ordered[held_out:], ordered[:held_out])


@dataclass
class Demonstrator:
    """A `RolloutEngine` that writes demonstrations: search then copy the code, or guess (see the module doc)."""

    tokenizer: Any
    search_share: float
    seed: int = 0
    eos_token_ids: set[int] = field(init=False)
    _plans: dict[int, bool] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.eos_token_ids = {int(self.tokenizer.eos_token_id)}
        self._rng = random.Random(self.seed)

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        if request.prompt_ids is None or request.sampling.seed is None:
            raise ValueError("Demonstrator needs token-id prompts and seeded sampling (AgentLoop seeds each turn)")
        # read with regexes: a BPE model's chat template glues special tokens to the words around them
        context = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
        searched = context.count("<information>")
        # AgentLoop seeds turn t of conversation c with base + 1_000_003 * c + t; here t == searches made
        plan = self._plans.setdefault(request.sampling.seed - searched, self._rng.random() < self.search_share)
        if searched:
            text = f"<answer> {_CODE_IN_PASSAGE.findall(context)[-1]} </answer>"
        elif plan:
            name = _NAME_IN_QUESTION.search(context)
            if name is None:
                raise ValueError(f"Demonstrator: no 'Code of <name>' question in the prompt {context!r}")
            text = f"<search> {name.group(1)} </search>"
        else:
            text = f"<answer> {self._rng.choice(CODES)} </answer>"
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if text.startswith("<answer>"):
            ids.append(int(self.tokenizer.eos_token_id))
        return [Completion(request.request_id, list(request.prompt_ids), ids, text, "stop", [0.0] * len(ids))]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        raise NotImplementedError("Demonstrator serves AgentLoop, which calls agenerate")

    def update_weights(self, named_tensors: Any) -> None:
        raise NotImplementedError("Demonstrator has no weights")
