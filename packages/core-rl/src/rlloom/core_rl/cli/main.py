"""`rlloom-core-rl`: commands on a run's files that need no app (today: export a sharded checkpoint)."""

from __future__ import annotations

import argparse

from rlloom.core_rl.cli.app_args import HelpFormatter, parse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rlloom-core-rl", formatter_class=HelpFormatter, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser(
        "export-hf",
        formatter_class=HelpFormatter,
        help="write a ranked run's sharded checkpoint as a Hugging Face model folder",
        description="Consolidate the policy's DCP shards of a checkpoint (checkpoints/step_N/, written with "
        "distributed.num_ranks > 1) into safetensors + config + tokenizer that from_pretrained and vLLM load.",
    )
    export.add_argument("checkpoint", help="the checkpoint folder, e.g. runs/x/checkpoints/step_100")
    export.add_argument("out", help="the folder to write the Hugging Face model into")
    export.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="cast weights (default: as saved)")
    args = parse(parser, argv)  # spelled-out flags; a typo gets the export-hf usage and the flag it meant
    if args.command == "export-hf":
        from rlloom.core_rl.run.export_hf import export_hf

        try:
            target = export_hf(args.checkpoint, args.out, dtype=args.dtype)
        except (ValueError, FileNotFoundError) as err:
            parser.exit(2, f"rlloom-core-rl export-hf: {err}\n")
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
