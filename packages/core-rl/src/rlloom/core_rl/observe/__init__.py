"""What a run reports: per-step metrics, trackers, the generation log and reward curves."""
