"""`slogen` explains itself (issue 29): --version, help for every flag, and the default of every flag that has one."""

from __future__ import annotations

import argparse

import pytest

from slogen import __version__
from slogen.cli import main, parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"slogen {__version__}\n"


@pytest.mark.parametrize("command", ["build", "validate", "generate"])
def test_every_flag_has_help_and_says_its_default(command):
    missing = []
    for action in subcommands()[command]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        text = action.help or ""
        if not text:
            missing.append(f"{action.option_strings or action.dest}: no help")
        elif action.option_strings and not switch and not action.required and "default" not in text.lower():
            missing.append(f"{action.option_strings}: no default in {text!r}")
    assert missing == []


def test_strict_and_autoscaling_are_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--strict every warning is an error" in text and "what CI should run" in text
    assert "--autoscaling DIR" in text and "default: autoscaling/ beside the first input directory" in text
