"""Command-line pieces: the shared app options and demo subcommand, and `rlloom-core-rl` itself."""
