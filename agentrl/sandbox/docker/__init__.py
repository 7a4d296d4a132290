"""The `docker` sandbox backend: sandboxes as hardened containers of one local Docker Engine.

    backend.py     DockerBackend, the control plane (the backend protocol: create, watch, destroy, sweep through the
                   Docker SDK on its own threads)
    specs.py       what a sandbox container is: its config, labels, volumes, the sweep rule over its labels and its
                   death cause from the engine's state (pure, no I/O)
    separation.py  resource separation: which layout keeps the agent's resources from the commands' (host cgroups,
                   two containers, none) and the probe that picks it
    hostdirs.py    the host side's per-sandbox socket dirs and host cgroups: made, removed, swept

Importing this package does not need the Docker SDK (the `docker` extra); creating a DockerBackend does.
"""

from agentrl.sandbox.docker.backend import DockerBackend
from agentrl.sandbox.docker.hostdirs import default_socket_root
from agentrl.sandbox.docker.specs import agent_container_memory, container_death_cause, should_remove

__all__ = ["DockerBackend", "agent_container_memory", "container_death_cause", "default_socket_root",
           "should_remove"]
