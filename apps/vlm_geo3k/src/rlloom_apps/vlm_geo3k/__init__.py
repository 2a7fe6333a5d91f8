"""Vision-language RL on Geometry3K: data preparation, configs, train/eval entry points."""
