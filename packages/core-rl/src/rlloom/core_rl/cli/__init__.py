"""Command-line pieces: the shared app options and demo subcommand, and `rlloom-core-rl` itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.cli.app_args import HelpFormatter as HelpFormatter
    from rlloom.core_rl.cli.app_args import check_file_arguments as check_file_arguments
    from rlloom.core_rl.cli.app_args import check_yaml as check_yaml
    from rlloom.core_rl.cli.app_args import command_parser as command_parser
    from rlloom.core_rl.cli.app_args import parse as parse
    from rlloom.core_rl.cli.app_args import quiet_interrupt as quiet_interrupt
    from rlloom.core_rl.cli.app_args import run_interruptible as run_interruptible
    from rlloom.core_rl.cli.demo import add_demo_command as add_demo_command
    from rlloom.core_rl.cli.demo import run_demo_command as run_demo_command

_EXPORTS = {
    "HelpFormatter": "app_args",
    "check_file_arguments": "app_args",
    "check_yaml": "app_args",
    "command_parser": "app_args",
    "parse": "app_args",
    "quiet_interrupt": "app_args",
    "run_interruptible": "app_args",
    "add_demo_command": "demo",
    "run_demo_command": "demo",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
