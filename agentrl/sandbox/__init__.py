"""Sandboxes: isolated, stateful places where a trajectory's tool calls run.

Public API: `SandboxPool` (leases), `Sandbox` (the handle a trajectory holds), `SandboxSpec`, `ExecResult`,
`SandboxPathError`, `SandboxFileError`, `SandboxSurvivorsError`, the `SandboxBackend` protocol and `make_backend`.
Backends live in `local.py`
(bubblewrap; its command line in `bubblewrap.py`) and the packages `docker/` and `kubernetes/` (each a `backend.py`
control plane over pure modules of what a sandbox is); the sweep rule all three share in `ownership.py`; the
in-sandbox agent in the package `agent/` (stdlib only, never imported by the host side except for its `protocol`
module), shipped as one artifact built by `artifact.py`.
"""

from agentrl.sandbox.base import AgentEndpoint, ExecResult, SandboxBackend, SandboxHandle, SandboxSpec
from agentrl.sandbox.client import AgentClient, Sandbox, SandboxFileError, SandboxPathError, SandboxSurvivorsError
from agentrl.sandbox.pool import SandboxPool, make_backend

__all__ = [
    "AgentClient",
    "AgentEndpoint",
    "ExecResult",
    "Sandbox",
    "SandboxBackend",
    "SandboxHandle",
    "SandboxFileError",
    "SandboxPathError",
    "SandboxPool",
    "SandboxSpec",
    "SandboxSurvivorsError",
    "make_backend",
]
