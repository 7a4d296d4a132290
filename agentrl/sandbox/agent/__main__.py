"""The agent's entry point: `main()` parses the command line (module docstring of the package), sets the agent's
process up, binds, prints READY_LINE and serves until SIGTERM. The artifact's root __main__.py calls it."""

from __future__ import annotations

import os
import signal
import socket
import sys

from .cgroups import CommandCgroup
from .handlers import Agent
from .identity import Identity, prctl_setup
from .process import EXIT_GRACE_S
from .protocol import READY_LINE
from .relay import wait_for_relay
from .server import HANDSHAKE_TIMEOUT_S, STOPPING, Acceptor


def _listen(opts: dict[str, str]) -> socket.socket:
    unix = opts.get("--unix")
    if unix:
        try:
            os.unlink(unix)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(unix)
        os.chmod(unix, 0o600)
    else:
        host, _, port = opts["--tcp"].rpartition(":")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]") or "0.0.0.0", int(port)))
    sock.listen(128)
    return sock


def _token(opts: dict[str, str]) -> str | None:
    if "--unix" in opts:
        return None
    token = os.environ.pop("AGENTRL_AGENT_TOKEN", "")  # popped: commands inherit the agent's environment
    if "--token-file" in opts:
        with open(opts["--token-file"], encoding="utf-8") as f:
            token = f.read().strip()
    if not token:
        sys.exit("agent: --tcp needs a bearer token: pass --token-file FILE or set AGENTRL_AGENT_TOKEN")
    return token


USAGE = ("usage: agent.pyz (--unix PATH | --tcp HOST:PORT [--token-file FILE]) --workspace DIR [--run-as UID:GID] "
         "[--writable DIR[:DIR...]] [--cgroups v1:DIR[:DIR...] | v2:DIR | --relay NAME] [--exit-grace SECONDS] "
         "[--handshake-timeout SECONDS]")
OPTIONS = ("--unix", "--tcp", "--token-file", "--workspace", "--run-as", "--writable", "--cgroups", "--exit-grace",
           "--handshake-timeout", "--relay")


def _parse(argv: list[str] | None) -> dict[str, str]:
    """--unix | --tcp, --token-file, --workspace, --run-as, --writable, --exit-grace, --handshake-timeout
    (hand-parsed: argparse costs ~10 ms)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) % 2 or any(k not in OPTIONS for k in args[::2]):
        sys.exit(USAGE)
    opts = dict(zip(args[::2], args[1::2]))
    if ("--unix" in opts) == ("--tcp" in opts) or "--workspace" not in opts or ("--relay" in opts and (
            "--cgroups" in opts or not opts["--relay"])):
        sys.exit(USAGE)
    return opts


def _run_as(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    uid, sep, gid = value.partition(":")
    if not (sep and uid.isdigit() and gid.isdigit()) or int(uid) == 0 or int(gid) == 0:
        sys.exit(f"agent: --run-as {value!r}: use UID:GID with both non-zero, e.g. --run-as 1000:1000")
    return int(uid), int(gid)


def _seconds(opts: dict[str, str], name: str, default: float) -> float:
    value = opts.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 3600:
        sys.exit(f"agent: {name} {value!r}: use a number of seconds between 0 and 3600, e.g. {name} {default:g}")
    return seconds


def _on_sigterm(signum: int, frame: object) -> None:
    STOPPING.set()
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    opts = _parse(argv)
    token = _token(opts)
    identity = Identity(_run_as(opts.get("--run-as")))
    writable = tuple(d for d in opts.get("--writable", "").split(":") if d)
    for d in (opts["--workspace"], *writable):
        os.makedirs(d, exist_ok=True)
    libc = prctl_setup()
    identity.setup(libc, opts["--workspace"], writable)
    if "--relay" in opts:
        wait_for_relay(opts["--relay"])
    agent = Agent(opts["--workspace"], identity, writable, CommandCgroup(opts.get("--cgroups")), libc,
                  exit_grace_s=_seconds(opts, "--exit-grace", EXIT_GRACE_S), relay=opts.get("--relay"))
    sock = _listen(opts)
    acceptor = Acceptor(sock, agent, token,
                        handshake_timeout_s=_seconds(opts, "--handshake-timeout", HANDSHAKE_TIMEOUT_S))
    signal.signal(signal.SIGTERM, _on_sigterm)
    print(READY_LINE, flush=True)
    try:
        acceptor.serve_forever()
    finally:
        agent.kill_groups()
        sock.close()
        if "--unix" in opts:
            try:
                os.unlink(opts["--unix"])
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
