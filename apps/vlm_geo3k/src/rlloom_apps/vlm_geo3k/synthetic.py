"""The demo's synthetic world: one coloured square on a noisy background, and the question "what colour is it?".

Small enough for the tiny Qwen2.5-VL on a CPU (56 x 56 pixels: a 4 x 4 patch grid, 4 image tokens), yet the answer
is only in the pixels: the question text is the same for every image, so a model that ignores the image can do
no better than guessing one of the colours. Squares vary in size (so how much of a 2 x 2 patch block they cover
varies) and position; the background noise varies per image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (235, 210, 20),
    "purple": (140, 40, 170),
    "orange": (245, 140, 20),
}
SIDE = 56  # pixels: with patch 14 and merge 2, exactly 4 image tokens
QUESTION = "What color is the square? Answer with the color in \\boxed{}."


@dataclass(frozen=True, slots=True)
class Picture:
    color: str
    size: int
    top: int
    left: int
    noise_seed: int

    def render(self) -> Image.Image:
        rng = np.random.default_rng(self.noise_seed)
        pixels = (255 - rng.integers(0, 48, (SIDE, SIDE, 1))).repeat(3, axis=2).astype(np.uint8)
        pixels[self.top : self.top + self.size, self.left : self.left + self.size] = COLORS[self.color]
        return Image.fromarray(pixels)


def make_pictures(count: int, seed: int, *, min_size: int = 18, max_size: int = 28) -> list[Picture]:
    rng = np.random.default_rng(seed)
    pictures = []
    for i in range(count):
        size = int(rng.integers(min_size, max_size + 1))
        top, left = (int(v) for v in rng.integers(0, SIDE - size + 1, 2))
        pictures.append(Picture(str(rng.choice(list(COLORS))), size, top, left, seed * 1_000_003 + i))
    return pictures


def to_rows(pictures: list[Picture], image_dir: Path, split: str) -> list[dict[str, Any]]:
    """EasyR1-layout rows (`<image>` marker in the prompt, `images` paths), PNGs written to `image_dir`."""
    image_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, picture in enumerate(pictures):
        path = image_dir / f"{split}_{i:04d}.png"
        picture.render().save(path)
        rows.append(
            {
                "data_source": "synthetic_color",
                "prompt": [{"role": "user", "content": f"<image>{QUESTION}"}],
                "images": [str(path.resolve())],  # as prepare-data writes: `eval --data` works from any folder
                "reward_model": {"style": "rule", "ground_truth": picture.color},
                "extra_info": {"index": i, "split": split, "size": picture.size},
            }
        )
    return rows
