"""Math and code RL with verifiable rewards: data preparation, configs, train/eval entry points."""
