"""The command line imports only the module of the command that runs, and lists every command with the help
line that command registers."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from enkflow.cli import COMMANDS, build_parser


def _help_lines(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.help for a in sub._choices_actions}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_registers_the_help_line_the_listing_shows(command: str) -> None:
    assert _help_lines(build_parser(command)) == COMMANDS


def test_version_and_help_import_no_sub_command(subprocess_env: dict[str, str]) -> None:
    code = ("import sys\nfrom enkflow.cli import main\n"
            "for argv in (['--version'], ['--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('enkflow.cli.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]"
