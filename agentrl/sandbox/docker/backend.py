"""The docker backend's control plane: sandboxes as hardened containers of one local Docker Engine.

Owns: creating, starting, watching and removing containers (and, two containers, their volumes) through the Docker
SDK (every blocking call runs on this backend's own thread pool, never on the event loop), deciding the separation
layout once (`separation.py`), the sandboxes' host socket dirs and cgroups (through `hostdirs.py`), reading death
causes and OOM kills from the engine, and sweeping orphans. Does not own: what a container is (its config, labels,
the sweep and death rules: `specs.py`), commands (they go to the in-sandbox agent over the unix socket through
`client.py`; never `docker exec`), leasing and warm pools (`pool.py`).

Leak-proofing: the agent gets SIGALRM at ttl_s, so the container stops even if nobody ever sweeps; `sweep()`
removes containers whose TTL passed, whose owner process on this host is gone (pid + start time, so a reused pid is
not mistaken for the owner), or of a given run.

The Docker Engine must be local (bind mounts of host paths): DOCKER_HOST over TCP/SSH to another machine does not work.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from agentrl.errors import (
    ConfigError,
    MissingDependencyError,
    SandboxEngineUnreachable,
    SandboxError,
    SandboxStartError,
)
from agentrl.sandbox import limits
from agentrl.sandbox.base import SIGKILL_UNPROVEN, AgentEndpoint, SandboxHandle, SandboxSpec
from agentrl.sandbox.client import probe_health
from agentrl.sandbox.docker import hostdirs
from agentrl.sandbox.docker import separation as layouts
from agentrl.sandbox.docker.specs import (
    L_CGROUPS,
    L_CREATED,
    L_OWNER,
    L_SANDBOX,
    L_SOCK,
    L_VOLUMES,
    OWNER,
    HostSide,
    commands_config,
    commands_container,
    container_config,
    container_death_cause,
    engine_killed,
    sandbox_labels,
    should_remove,
    volume_labels,
    volume_options,
)
from agentrl.sandbox.ownership import OwnerRecord

try:
    import docker
    import docker.errors
    import requests
except ImportError:  # pragma: no cover - exercised only without the [docker] extra
    docker = None

log = logging.getLogger("agentrl.sandbox")
T = TypeVar("T")

DEATH_SETTLE_S = 3.0  # how long death_cause waits for dockerd to record an exit it has not seen yet


def _why(e: Exception) -> str:
    if isinstance(e, docker.errors.APIError):
        return str(e.explanation or e)
    return f"{e} (is dockerd running? start it, e.g. .ci/docker-setup.sh)"


class DockerBackend:
    """Sandboxes as containers of one local Docker Engine. Blocking SDK calls run on a private thread pool of
    `max_workers` threads (also the SDK's connection-pool size), so a slow dockerd never blocks the event loop and
    never takes more than that many threads. `state_dir` holds the per-sandbox socket dirs (default:
    `hostdirs.default_socket_root()`); `network` is the Docker network of sandboxes whose spec allows network."""

    name = "docker"

    def __init__(self, *, docker_host: str | None = None, state_dir: str | os.PathLike[str] | None = None,
                 network: str = "bridge", max_workers: int = 16, api_timeout_s: float = 60.0,
                 start_timeout_s: float = 60.0, agent_file: Path | None = None,
                 separate_resources: bool = True, separation: str = "auto") -> None:
        if docker is None:
            raise MissingDependencyError(
                "the docker sandbox backend needs the Docker SDK: pip install 'agentrl[docker]'")
        if max_workers < 1:
            raise ConfigError(f"DockerBackend max_workers={max_workers}: use 1 or more")
        self._docker_host = docker_host
        root = Path(state_dir) if state_dir is not None else hostdirs.default_socket_root(docker_host)
        self._socket_root = root.absolute()
        self._max_workers = max_workers
        self._api_timeout_s = api_timeout_s
        self._start_timeout_s = start_timeout_s
        self._threads = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentrl-docker")
        # separate_resources=False: one budget for agent and commands, as separation "off" (benchmarks compare)
        if separation not in layouts.SEPARATIONS:
            raise ConfigError(f"DockerBackend separation={separation!r}: use one of {', '.join(layouts.SEPARATIONS)}")
        self.separation = separation if separate_resources else "off"
        self._mode: str | None = None  # "cgroups" | "containers" | "" (none), decided once
        self._limiter: limits.Limiter | None = None
        self._separation_checked = False
        self._plans: dict[str, limits.LimitPlan] = {}  # resource-separated sandboxes: their host cgroups
        self._api: Any = None
        self._api_lock = asyncio.Lock()
        self._live: dict[str, SandboxHandle] = {}  # created by this object and not destroyed yet
        self._unremoved: set[str] = set()  # names in _live whose removal failed (dockerd down): retried later
        self._owner = OwnerRecord.here()
        self._host = self._owner.host
        # who owns the workspace and runs commands: 1000 when separated from the (root) agent, else the host user
        self._side = HostSide.here(agent_file=agent_file, network=network)
        self._root_host = self._side.root
        if not self._root_host:
            log.warning("DockerBackend: not running as root, so each container runs its agent and commands under one "
                        "uid (uid_separated=false): a command can kill or trace its sandbox's agent. Run as root for "
                        "uid separation.")

    def __repr__(self) -> str:
        return f"DockerBackend(docker_host={self._docker_host!r}, socket_root={str(self._socket_root)!r})"

    # ------------------------------------------------------------------ plumbing

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking SDK call on the backend's threads. If the caller is cancelled, still wait for the call to
        finish (at most api_timeout_s) before re-raising: a cancelled create must not finish creating a container
        after the cleanup that removes it has already run."""
        fut = asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            if not fut.cancelled():
                fut.exception()  # retrieved: the cancellation is what propagates
            raise

    async def api(self) -> Any:
        """The low-level `docker.APIClient`, created on first use (creating it asks dockerd for its version)."""
        async with self._api_lock:
            if self._api is None:
                self._api = await self._call(self._connect)
        return self._api

    def _connect(self) -> Any:
        base_url = self._docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        try:
            return docker.APIClient(base_url=base_url, version="auto", timeout=int(self._api_timeout_s),
                                    max_pool_size=self._max_workers)
        except docker.errors.DockerException as e:
            raise SandboxEngineUnreachable(
                f"Docker Engine not reachable at {base_url} ({e}); start dockerd (as root: .ci/docker-setup.sh), or "
                "point sandbox.backend.docker_host / DOCKER_HOST at a running local engine") from e

    # ------------------------------------------------------------------ create

    async def create(self, spec: SandboxSpec, labels: dict[str, str]) -> SandboxHandle:
        """Create and start one container; return once its agent answers /health. Cancellation-safe: a container
        created by a cancelled or failed call is removed before the exception propagates."""
        name = f"agentrl-{secrets.token_hex(6)}"
        sock_dir = self._socket_root / name
        all_labels = sandbox_labels(spec, labels, sock_dir, self._owner, time.time())
        handle = SandboxHandle(id=name, backend=self.name, labels=all_labels,
                               endpoint=AgentEndpoint(kind="unix", address=str(sock_dir / "agent.sock")))
        if self._unremoved:
            await self._retry_removals()
        self._live[name] = handle
        try:
            await self._call(hostdirs.make_sock_dir, self._socket_root, sock_dir)
            limiter = await self._separation(await self.api())
            if limiter is not None:
                plan = await self._call(limiter.prepare, name, spec, separate=True)
                self._plans[name] = plan
                handle.labels[L_CGROUPS] = ":".join(plan.cgroups)
            await self._create_and_start(handle, spec, sock_dir)
            await self._wait_ready(handle, time.monotonic() + self._start_timeout_s)
        except BaseException:
            await asyncio.shield(self._discard(handle))
            raise
        return handle

    async def _create_and_start(self, handle: SandboxHandle, spec: SandboxSpec, sock_dir: Path) -> None:
        api = await self.api()
        if self._mode == "containers":
            volumes = await self._call(self._make_volumes, api, handle, spec)
            configs = [self._container_config(api, handle, spec, sock_dir, volumes=volumes),
                       commands_config(api, handle, spec, volumes)]
        else:
            configs = [self._container_config(api, handle, spec, sock_dir)]
        t0 = time.monotonic()
        for config in configs:
            await self._create(api, config, spec)
        t1 = time.monotonic()
        for config in configs:  # the agent's first: the commands' joins its namespaces
            try:
                await self._call(api.start, config["name"])
            except requests.ConnectionError as e:
                raise SandboxEngineUnreachable(f"docker start {config['name']} ({spec.image}) failed: {_why(e)}") from e
            except (docker.errors.DockerException, requests.RequestException) as e:
                raise SandboxStartError(f"docker start {config['name']} ({spec.image}) failed: {_why(e)}") from e
        handle.timings.update(create_s=t1 - t0, start_s=time.monotonic() - t1)

    async def _create(self, api: Any, config: dict, spec: SandboxSpec) -> None:
        try:
            await self._call(api.create_container, **config)
        except docker.errors.ImageNotFound as e:
            raise ConfigError(
                f"sandbox image {spec.image!r} not found in the Docker Engine: build it (agentrl/python: "
                "`sandbox_images/build.sh --offline-base`; an env's per-task images: its own command, e.g. "
                "`python -m agentrl_repo_fix images`), or set sandbox.spec.image to an image that exists") from e
        except requests.ConnectionError as e:  # refused / no socket: dockerd is away, not this container's fault
            raise SandboxEngineUnreachable(f"docker create {config['name']} ({spec.image}) failed: {_why(e)}") from e
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxStartError(f"docker create {config['name']} ({spec.image}) failed: {_why(e)}") from e

    def _make_volumes(self, api: Any, handle: SandboxHandle, spec: SandboxSpec) -> dict[str, str]:
        """Two containers: the tmpfs mounts both see (mount path -> volume name), as tmpfs volumes of the local
        driver (sized like the single container's tmpfs mounts), labelled for sweep() and removed by destroy()."""
        wanted = volume_options(spec, self._side.command_user)
        labels = volume_labels(handle)
        out: dict[str, str] = {}
        for i, (path, opts) in enumerate(wanted.items()):
            name = f"{handle.id}-v{i}"
            api.create_volume(name=name, driver="local", labels=labels,
                              driver_opts={"type": "tmpfs", "device": "tmpfs", "o": opts})
            out[path] = name
        handle.labels[L_VOLUMES] = ":".join(out.values())
        return out

    # ------------------------------------------------------------------ resource separation

    async def _separation(self, api: Any) -> limits.Limiter | None:
        """Decide once how the agent's resources are kept from the commands' (`self._mode`): "cgroups" (host cgroups;
        returns their limiter), "containers" (the agent in a container of its own) or "" (one budget: why is
        logged once)."""
        if not self._separation_checked:
            self._limiter, self._mode, why = await self._call(layouts.probe, api, separation=self.separation,
                                                              root_host=self._root_host, docker_host=self._docker_host)
            self._separation_checked = True
            if not self._mode:
                log.warning("DockerBackend: the agent and the commands of a container share its limits (%s)", why)
            elif why:
                log.info("DockerBackend: the agent gets a container of its own (%s)", why)
        return self._limiter

    def _container_config(self, api: Any, handle: SandboxHandle, spec: SandboxSpec, sock_dir: Path,
                          volumes: dict[str, str] | None = None) -> dict:
        """The (agent's) container of `handle` (`specs.container_config`), with its host cgroups when it has them."""
        return container_config(api, handle, spec, sock_dir, host=self._side, plan=self._plans.get(handle.id),
                                volumes=volumes)

    async def _wait_ready(self, handle: SandboxHandle, deadline: float) -> None:
        """Poll /health (a missing socket fails the connect at once) with a growing delay. Watches the container
        state about once a second so an agent that cannot start fails fast with its log, not at the deadline."""
        t0 = time.monotonic()
        delay, next_state = 0.002, t0 + 0.5
        while True:
            if await probe_health(handle.endpoint):
                handle.timings["agent_ready_s"] = time.monotonic() - t0
                return
            now = time.monotonic()
            if now >= next_state:
                next_state = now + 1.0
                await self._raise_if_exited(handle)
            if now >= deadline:
                raise SandboxStartError(f"agent in container {handle.id} did not answer within "
                                        f"{self._start_timeout_s:.0f}s; log: {await self._log_tail(handle)}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _raise_if_exited(self, handle: SandboxHandle) -> None:
        try:
            state = await self._state(handle)
        except requests.ConnectionError as e:  # dockerd went away while the container started (it died with it)
            raise SandboxEngineUnreachable(f"docker inspect {handle.id} failed while waiting for its agent: "
                                           f"{_why(e)}") from e
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxStartError(f"docker inspect {handle.id} failed while waiting for its agent: {_why(e)}") from e
        if state is not None and not state.get("Running"):
            raise SandboxStartError(f"container {handle.id} exited with {state.get('ExitCode')} before its agent "
                                    f"answered; log: {await self._log_tail(handle)}")

    async def _log_tail(self, handle: SandboxHandle) -> str:
        try:
            raw = await self._call((await self.api()).logs, handle.id, tail=20)
        except Exception as e:  # noqa: BLE001 - diagnostics only: never mask the original failure
            return f"<no log: {e}>"
        return raw.decode("utf-8", "replace").strip()[-2000:] or "<empty>"

    # ------------------------------------------------------------------ watch / remove

    async def _state(self, handle: SandboxHandle) -> dict[str, Any] | None:
        """The container's State from docker inspect; None when it does not exist."""
        try:
            info = await self._call((await self.api()).inspect_container, handle.id)
        except docker.errors.NotFound:
            return None
        return info.get("State") or {}

    async def alive(self, handle: SandboxHandle) -> bool:
        """Running per dockerd; when dockerd itself does not answer, whether the agent does."""
        try:
            state = await self._state(handle)
        except (docker.errors.DockerException, OSError, SandboxStartError):
            return await probe_health(handle.endpoint)
        return bool(state and state.get("Running") and not state.get("Restarting"))

    async def death_cause(self, handle: SandboxHandle) -> str | None:
        """From docker inspect: "deleted" (no such container, or being removed), "oom" (the kernel OOM-killed the
        container's agent: OOMKilled with a SIGKILL exit), "killed:9" (uid-separated: a SIGKILL sent through the
        engine, `docker kill`, as its kill event records, and no OOM event), SIGKILL_UNPROVEN (uid-separated: a
        SIGKILL exit with neither record: the OOM killer unflagged, or a kill on the host), "killed:15"
        (uid-separated: the agent ended on SIGTERM, `docker stop` or dockerd shutting down), "signal:<n>" (exit code
        128+n, as docker-init reports a signalled agent), "exited:<code>",
        "engine_lost" (dockerd refuses or drops the connection: it stopped or is restarting); None while it still
        runs after DEATH_SETTLE_S, or when dockerd answers with an error."""
        deadline = time.monotonic() + DEATH_SETTLE_S
        while True:  # dockerd records the exit a moment after the agent's socket broke: wait for it to settle
            try:
                state = await self._state(handle)
            except (requests.ConnectionError, SandboxStartError) as e:
                # the engine's socket refuses or drops connections: dockerd stopped (a restart kills its containers
                # unless live-restore is on). No command reaches the socket, so this is the sandbox's outside cause.
                log.warning("docker inspect %s: the Docker Engine does not answer (%s)", handle.id, e)
                return "engine_lost"
            except (docker.errors.DockerException, requests.RequestException, OSError) as e:
                log.warning("docker inspect %s failed: %s", handle.id, e)
                return None
            cause = container_death_cause(state, uid_separated=self._root_host)
            if cause == SIGKILL_UNPROVEN:
                cause = container_death_cause(state, uid_separated=True, engine_kill=await self._engine_kill(handle))
            if cause is not None or time.monotonic() >= deadline:
                return cause
            await asyncio.sleep(0.1)

    async def _engine_kill(self, handle: SandboxHandle) -> bool:
        """The engine's events since the container was created show a SIGKILL sent to it through the API and no OOM
        of it: the positive record that its SIGKILL came from outside. False when they do not, or cannot be read
        (the engine keeps a bounded backlog of events: a record gone from it proves nothing either)."""
        since = int(float(handle.labels.get(L_CREATED, "0"))) - 1
        until = f"{time.time():.9f}"
        filters = {"container": handle.id, "type": "container", "event": ["kill", "oom"]}
        try:
            api = await self.api()
            events = await self._call(lambda: list(api.events(since=since, until=until, filters=filters,
                                                              decode=True)))
        except (docker.errors.DockerException, requests.RequestException, OSError) as e:
            log.warning("docker events %s failed: %s", handle.id, e)
            return False
        return engine_killed(events)

    async def oom_kills(self, handle: SandboxHandle) -> int:
        """How many times the kernel's OOM killer fired in this container's cgroup since it was created (Docker
        'oom' events; resource-separated: the kernel's count in the `commands` cgroup, where the limit is). A command
        that died with SIGKILL (exit code -9 / 137) was killed for memory when this grew."""
        plan = self._plans.get(handle.id)
        if plan is not None:
            return await self._call(limits.oom_kills, plan.command_cgroups)
        api = await self.api()
        since = int(float(handle.labels.get(L_CREATED, "0"))) - 1
        until = f"{time.time():.9f}"  # seconds.nanoseconds: a whole-second 'until' in the future would block
        filters = {"container": commands_container(handle) or handle.id, "event": "oom", "type": "container"}
        events = await self._call(lambda: list(api.events(since=since, until=until, filters=filters, decode=True)))
        return len(events)

    async def destroy(self, handle: SandboxHandle) -> None:
        """Remove the container (SIGKILL, no grace: the trajectory is over) and its socket dir. Idempotent.
        When dockerd cannot remove it now, the next create() and close() try again."""
        commands = commands_container(handle)
        try:
            if commands:
                await self._remove(commands)
            await self._remove(handle.id)
            if commands:
                await self._call(self._remove_volumes, await self.api(), handle.labels[L_VOLUMES].split(":"))
        except BaseException:
            self._unremoved.add(handle.id)
            raise
        self._live.pop(handle.id, None)
        self._unremoved.discard(handle.id)
        await self._call(hostdirs.remove_sock_dir, self._socket_root, handle.labels.get(L_SOCK))
        plan = self._plans.pop(handle.id, None)
        if plan is not None:
            await self._call(limits.remove_cgroups, plan.cgroups)

    async def _retry_removals(self) -> None:
        for name in list(self._unremoved):
            handle = self._live.get(name)
            try:
                if handle is not None:
                    await self.destroy(handle)
                else:
                    self._unremoved.discard(name)
            except Exception as e:  # noqa: BLE001 - retried later; must not fail the create that called it
                log.warning("sandbox %s still not removed: %s", name, e)
                return  # dockerd is still unhappy: try again next time
            log.info("removed sandbox %s on retry", name)

    async def _discard(self, handle: SandboxHandle) -> None:
        """Best-effort removal after a failed or cancelled create (the original error is what matters)."""
        try:
            await self.destroy(handle)
        except Exception as e:  # noqa: BLE001 - the create's own error is what propagates
            log.warning("could not remove half-created sandbox %s: %s (agentrl sandbox gc removes it)", handle.id, e)

    async def _remove(self, container: str) -> None:
        api = await self.api()
        try:
            await self._call(api.remove_container, container, force=True, v=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as e:
            if e.status_code == 409 and "already in progress" in str(e.explanation):
                return
            raise SandboxError(f"docker rm -f {container} failed: {e.explanation or e}") from e
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxError(f"docker rm -f {container} failed: dockerd unreachable ({e})") from e

    def _remove_volumes(self, api: Any, names: list[str]) -> None:
        """Remove a sandbox's volumes (two containers), only names of ours (a label is data)."""
        for name in names:
            if not name.startswith("agentrl-"):
                continue
            try:
                api.remove_volume(name, force=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as e:
                raise SandboxError(f"docker volume rm {name} failed: {e.explanation or e}") from e
            except (docker.errors.DockerException, requests.RequestException) as e:
                raise SandboxError(f"docker volume rm {name} failed: dockerd unreachable ({e})") from e

    def _sweep_volumes(self, api: Any, live: set[str], now: float) -> None:
        """Volumes of sandboxes whose containers are gone (two containers) and that are old enough not to belong to
        a create in progress: removed (one still in use is refused by dockerd and kept)."""
        found = (api.volumes(filters={"label": f"{L_OWNER}={OWNER}"}) or {}).get("Volumes") or []
        for v in found:
            sandbox = (v.get("Labels") or {}).get(L_SANDBOX, "")
            try:
                age = now - datetime.fromisoformat(str(v.get("CreatedAt"))).timestamp()
            except ValueError:
                age = hostdirs.STALE_DIR_S + 1
            if sandbox not in live and age > hostdirs.STALE_DIR_S:
                try:
                    self._remove_volumes(api, [v["Name"]])
                except SandboxError as e:  # still in use (a create in progress holds it): the next sweep
                    log.info("sweep: volume %s not removed: %s", v["Name"], e)

    async def sweep(self, *, run_id: str | None = None, all_runs: bool = False) -> int:
        """Remove agentrl containers and return how many: with neither argument, orphans (TTL passed, or owner
        process on this host gone); with `run_id`, every container of that run; with `all_runs`, every one."""
        api = await self.api()
        await self._separation(api)  # where this host keeps sandbox cgroups (to remove those of the removed)
        found = await self._call(api.containers, all=True, filters={"label": f"{L_OWNER}={OWNER}"})
        now = time.time()
        doomed = [c for c in found if should_remove(c.get("Labels") or {}, now=now, host=self._host,
                                                    run_id=run_id, all_runs=all_runs)]
        results = await asyncio.gather(*(self._remove(c["Id"]) for c in doomed), return_exceptions=True)
        removed = 0
        for c, result in zip(doomed, results):
            if isinstance(result, BaseException):
                log.warning("sweep: could not remove container %s: %s", c["Id"][:12], result)
                continue
            removed += 1
            await self._call(hostdirs.remove_sock_dir, self._socket_root, (c.get("Labels") or {}).get(L_SOCK))
            await self._call(hostdirs.remove_cgroups, self._limiter, (c.get("Labels") or {}).get(L_CGROUPS))
        live = {n.lstrip("/") for c in found if c not in doomed for n in c.get("Names") or []}
        await self._call(hostdirs.sweep_stale_dirs, self._socket_root, self._limiter, live, now)
        await self._call(self._sweep_volumes, api, live | set(self._live), now)
        return removed

    async def close(self) -> None:
        """Destroy every sandbox this object created and has not destroyed yet, then close the API client and
        stop the thread pool."""
        live = list(self._live.values())
        results = await asyncio.gather(*(self.destroy(h) for h in live), return_exceptions=True)
        for handle, result in zip(live, results):
            if isinstance(result, BaseException):
                log.warning("could not remove sandbox %s on close: %s (agentrl sandbox gc removes it)",
                            handle.id, result)
        api, self._api = self._api, None
        if api is not None:
            await self._call(api.close)
        await asyncio.to_thread(self._threads.shutdown, wait=True)
