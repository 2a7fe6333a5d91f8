"""Search-R1 style search agent: data preparation, configs, train/eval/infer entry points."""
