"""Building a run: its folder, its parts, its state, checkpoints (whole and sharded) and their export."""
