"""`agentrl ...` with the test-only `print_number` env registered (run as a script by test_trainer.py).

Adds the train/eval commands to the parser if `agentrl.cli` does not register them yet, then runs the real `main`.
"""

from __future__ import annotations

import argparse
import sys

import trainer_toys  # noqa: F401  (registers the print_number env)

from agentrl import cli
from agentrl.cli.train import add_train_commands

_build_parser = cli.build_parser


def build_parser() -> argparse.ArgumentParser:
    parser = _build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "train" not in sub.choices:
        add_train_commands(sub)
    return parser


if __name__ == "__main__":
    cli.build_parser = build_parser
    sys.exit(cli.main(sys.argv[1:]))
