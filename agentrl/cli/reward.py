"""`agentrl reward serve`: the reference reward-model stand-in (`agentrl.reward.server`) for the `http` source.

    agentrl reward serve [--host 127.0.0.1] [--port 8088] [--fail-first N] [--garbage]

Registered into the parser by `add_reward_commands(subparsers)`.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_reward_commands(sub: Any) -> None:
    r = sub.add_parser("reward", help="reward services").add_subparsers(dest="reward_cmd", required=True)
    s = r.add_parser("serve", help="reference reward-model stand-in (deterministic scorer) for the http source")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8088, help="0: any free port (the URL is printed)")
    s.add_argument("--fail-first", type=int, default=0, help="answer the first N requests with HTTP 503")
    s.add_argument("--garbage", action="store_true", help="answer every request with a body that is not a reward")
    s.set_defaults(func=_cmd_serve)


def _cmd_serve(a: argparse.Namespace) -> int:
    from agentrl.cli import _run_cancellable
    from agentrl.reward.server import serve

    return _run_cancellable(serve(a.host, a.port, fail_first=a.fail_first, garbage=a.garbage))
