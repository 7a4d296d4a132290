"""SandboxPool: leases of fresh sandboxes from a warm pool, with a concurrency limit and leak-proof cleanup.

Owns: resolving a backend by name, the start-up sweep of orphans, one sandbox per lease (destroyed afterwards, never
reused), background refill of `warm` ready sandboxes, health-checking warm sandboxes before handing them out,
cleanup under cancellation, and per-lease timings/counters (`stats()`). Does not own: how sandboxes are created
(backends) or what is done inside them (`Sandbox`).

    async with SandboxPool(backend="local", spec=SandboxSpec(), warm=4, max_sandboxes=16) as pool:
        async with pool.lease() as sb:      # waits while max_sandboxes leases are out
            await sb.exec("echo hi")

Ordering: a lease takes a ready warm sandbox if there is one, else starts one itself (cold) instead of waiting for
the refiller.

Images: `lease(image=...)` asks for the pool's spec with another image (e.g. an env whose tasks each need their own
image: `Env.sandbox_image(task)`). Warm sandboxes are kept per image; the `warm` target is shared by the images in
proportion to the last `warm` leases (the pool's own image until then), and when the warm set is full a ready
sandbox of an image that is over its share is destroyed to make room for one that is under it.

Pool exit stops the refillers (a create in flight cleans up after itself), destroys warm and still-leased sandboxes
and waits for every destroy in flight, then closes a backend it created.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import socket
import statistics
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from agentrl.errors import (
    ConfigError,
    MissingDependencyError,
    SandboxEngineUnreachable,
    SandboxError,
    SandboxStartError,
)
from agentrl.sandbox.base import SandboxBackend, SandboxSpec
from agentrl.sandbox.client import MAX_CONNECTIONS, Sandbox
from agentrl.sandbox.gate import StartGate

log = logging.getLogger("agentrl.sandbox")

# name -> (module, class). docker / kubernetes are imported lazily: their SDKs are optional extras.
BACKENDS: Mapping[str, tuple[str, str]] = {
    "local": ("agentrl.sandbox.local", "LocalBackend"),
    "docker": ("agentrl.sandbox.docker", "DockerBackend"),
    "kubernetes": ("agentrl.sandbox.kubernetes", "KubernetesBackend"),
}
TIMING_WINDOW = 10_000  # per-lease timings kept for stats()
ENGINE_POLL_S = (0.5, 5.0)  # first / longest pause between starts while the backend's engine is away
FDS_PER_SANDBOX = MAX_CONNECTIONS + 2  # its keep-alive connections to the agent, a start-up probe, the backend's own
FD_RESERVE = 1024  # the rest of the process: model files, the store, the API client's connections, logs


def make_backend(name: str, **options: Any) -> SandboxBackend:
    """Instantiate the backend called `name` with backend-specific `options`."""
    if name not in BACKENDS:
        raise ConfigError(f"sandbox backend {name!r} is unknown: set backend to one of {', '.join(BACKENDS)}")
    module_name, cls_name = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            raise ConfigError(f"sandbox backend {name!r} is not available in this agentrl version") from e
        raise MissingDependencyError(
            f"sandbox backend {name!r} needs {e.name!r}: "
            f"pip install 'agentrl[{name if name != 'kubernetes' else 'k8s'}]'"
        ) from e
    return getattr(module, cls_name)(**options)


def _summary(values: deque[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(ordered), "p50": statistics.median(ordered), "mean": statistics.fmean(ordered),
            "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], "max": ordered[-1]}


def ensure_fd_headroom(max_sandboxes: int) -> int:
    """Raise this process's soft open-file limit to what `max_sandboxes` sandboxes may hold (a socket per connection
    to each agent), up to the hard limit, and return it. Many hosts start processes at a soft limit of 1024: without
    this, a pool of ~200 sandboxes fails with EMFILE ("too many open files") mid-run, as connections, not as a
    clear error. Warns, naming the fix, when the hard limit is too low."""
    import resource

    need = max_sandboxes * FDS_PER_SANDBOX + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    new = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < need:
        log.warning("max_sandboxes=%d may hold %d open files but this process may open at most %d (hard limit): "
                    "raise it (ulimit -Hn; systemd LimitNOFILE=; a container's nofile ulimit) or lower "
                    "max_sandboxes", max_sandboxes, need, new)
    return new


class SandboxPool:
    """A pool of sandboxes of one spec. Use as an async context manager; `lease()` hands out one sandbox."""

    def __init__(self, backend: str | SandboxBackend = "local", spec: SandboxSpec | None = None, *, warm: int = 0,
                 max_sandboxes: int = 16, run_id: str | None = None, unsafe_no_isolation: bool = False,
                 state_dir: str | os.PathLike[str] | None = None, start_timeout_s: float = 60.0,
                 start_attempts: int = 2, refill_concurrency: int = 4, sweep_on_start: bool = True,
                 backend_options: Mapping[str, Any] | None = None, max_starting: int | None = None,
                 create_rate: float | None = None, cold_start_grace_s: float = 0.0,
                 engine_wait_s: float = 300.0) -> None:
        if warm < 0 or max_sandboxes < 1 or start_attempts < 1 or refill_concurrency < 1:
            raise ConfigError(f"SandboxPool: need warm >= 0 (got {warm}), max_sandboxes >= 1 (got {max_sandboxes}),"
                              f" start_attempts >= 1 (got {start_attempts}), refill_concurrency >= 1")
        self.spec = spec or SandboxSpec()
        self.warm = min(warm, max_sandboxes)
        self.max_sandboxes = max_sandboxes
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.start_timeout_s = start_timeout_s
        self.start_attempts = start_attempts
        self.sweep_on_start = sweep_on_start
        # Creation admission (gate.py): at most max_starting creating at once, create_rate per second, leases'
        # cold starts before refills. cold_start_grace_s: a lease finding no warm sandbox first waits this long
        # for a refill already in flight (only while refills outnumber the leases already waiting for one).
        if cold_start_grace_s < 0:
            raise ConfigError(f"SandboxPool: cold_start_grace_s={cold_start_grace_s}: use 0 (off) or more seconds")
        if engine_wait_s < 0:
            raise ConfigError(f"SandboxPool: engine_wait_s={engine_wait_s}: use 0 (no wait) or more seconds")
        self.cold_start_grace_s = cold_start_grace_s
        # a start whose backend engine does not answer at all (dockerd restarting) waits this long for it to come
        # back, polling: it is not a failed start attempt (a lease would otherwise fail in milliseconds)
        self.engine_wait_s = engine_wait_s
        self._gate = StartGate(max_starting, create_rate)
        self._grace_waiters: Counter[str] = Counter()
        self._backend_arg = backend
        self._backend_options = dict(backend_options or {})
        if unsafe_no_isolation:
            self._backend_options["unsafe_no_isolation"] = True
        if state_dir is not None:
            self._backend_options["state_dir"] = state_dir
        self._refill_concurrency = min(refill_concurrency, max(self.warm, 1))
        self.backend: SandboxBackend | None = None
        self._owns_backend = isinstance(backend, str)
        self._labels = {"agentrl/run-id": self.run_id, "agentrl/owner-pid": str(os.getpid()),
                        "agentrl/owner-host": socket.gethostname()}
        self._ready: dict[str, deque[Sandbox]] = {}  # warm sandboxes by image
        self._active: set[Sandbox] = set()
        self._starting: Counter[str] = Counter()  # creates in flight by image (refills)
        self._demand: deque[str] = deque([self.spec.image] * max(self.warm, 1), maxlen=max(self.warm, 1))
        self._specs: dict[str, SandboxSpec] = {self.spec.image: self.spec}
        self._slots = asyncio.Semaphore(max_sandboxes)
        self._need = asyncio.Event()  # set when the warm set may be short (a lease took one, a lease ended)
        self._grew = asyncio.Event()  # set whenever a warm sandbox becomes ready (for fill())
        self._workers: list[asyncio.Task[None]] = []
        self._destroys: set[asyncio.Task[None]] = set()
        self._open = False
        self._closed = False
        self._counters = {"leases": 0, "warm_hits": 0, "cold_starts": 0, "failures": 0, "replaced": 0,
                          "destroyed": 0, "evicted": 0}
        self._timings: dict[str, deque[float]] = {k: deque(maxlen=TIMING_WINDOW)
                                                  for k in ("wait_s", "create_s", "agent_ready_s", "lease_s")}

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> SandboxPool:
        if self._open or self._closed:
            raise RuntimeError("a SandboxPool can be entered once")
        ensure_fd_headroom(self.max_sandboxes)
        if isinstance(self._backend_arg, str):
            self.backend = await asyncio.to_thread(make_backend, self._backend_arg, **self._backend_options)
        else:
            self.backend = self._backend_arg
        self._open = True
        try:
            if self.sweep_on_start:
                removed = await self.backend.sweep()
                if removed:
                    log.info("removed %d orphaned sandbox(es) of dead runs", removed)
            self._workers = [asyncio.create_task(self._refill_worker(), name=f"sandbox-refill-{i}")
                             for i in range(self._refill_concurrency if self.warm else 0)]
            self._need.set()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Destroy everything this pool holds. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        doomed = [sb for ready in self._ready.values() for sb in ready] + list(self._active)
        self._ready.clear()
        for sb in doomed:
            self._destroy_later(sb)
        while self._destroys:
            await asyncio.gather(*list(self._destroys), return_exceptions=True)
        if self._owns_backend and self.backend is not None:
            await self.backend.close()

    # ------------------------------------------------------------ leases

    def spec_for(self, image: str | None) -> SandboxSpec:
        """The pool's spec, with `image` instead of its own when given."""
        image = image or self.spec.image
        if image not in self._specs:
            self._specs[image] = self.spec.model_copy(update={"image": image})
        return self._specs[image]

    @asynccontextmanager
    async def lease(self, image: str | None = None) -> AsyncIterator[Sandbox]:
        """One fresh sandbox (of the pool's spec, with `image` when given) for the duration of the block; destroyed
        afterwards (also when cancelled)."""
        if not self._open or self._closed:
            raise RuntimeError("use the pool inside 'async with SandboxPool(...) as pool'")
        spec = self.spec_for(image)
        t0 = time.monotonic()
        async with self._slots:
            self._demand.append(spec.image)
            sb = await self._acquire(spec)
            self._active.add(sb)
            self._need.set()
            t1 = time.monotonic()
            self._timings["wait_s"].append(t1 - t0)
            self._counters["leases"] += 1
            try:
                yield sb
            finally:
                self._active.discard(sb)
                self._need.set()  # with fewer leases out, the warm target may be higher again
                self._timings["lease_s"].append(time.monotonic() - t1)
                await self._dispose(sb)

    async def _acquire(self, spec: SandboxSpec) -> Sandbox:
        ready = self._ready.setdefault(spec.image, deque())
        while ready:
            sb = ready.popleft()
            try:
                healthy = await sb.health()
            except BaseException:  # cancelled while checking: the sandbox is in no list any more
                await self._dispose(sb)
                raise
            if healthy:
                self._counters["warm_hits"] += 1
                return sb
            log.warning("warm sandbox %s failed its health check; replacing it", sb.id)
            self._counters["failures"] += 1
            self._counters["replaced"] += 1
            self._destroy_later(sb)
        if await self._wait_for_refill(spec.image):
            return await self._acquire(spec)
        self._counters["cold_starts"] += 1
        return await self._start(spec)

    async def _wait_for_refill(self, image: str) -> bool:
        """The cold-start grace. True when a warm sandbox of `image` became ready while waiting."""
        if self.cold_start_grace_s <= 0 or self._starting[image] <= self._grace_waiters[image]:
            return False
        self._grace_waiters[image] += 1
        ready = self._ready.setdefault(image, deque())
        try:
            async with asyncio.timeout(self.cold_start_grace_s):
                while not ready:
                    self._grew.clear()
                    await self._grew.wait()
        except TimeoutError:
            pass
        finally:
            self._grace_waiters[image] -= 1
        return bool(ready)

    async def death_cause(self, sb: Sandbox) -> str | None:
        """The backend's proven cause of `sb`'s death (see `SandboxBackend.death_cause`); None when the backend cannot
        tell (or fails to: this never raises for a backend error). Call it inside the lease."""
        probe = getattr(self.backend, "death_cause", None)
        if probe is None:
            return None
        try:
            return await probe(sb.handle)
        except Exception as e:  # noqa: BLE001 - a fact we could not get is "unknown", not a second failure
            log.warning("could not tell why sandbox %s died: %s", sb.id, e)
            return None

    async def _start(self, spec: SandboxSpec) -> Sandbox:
        """Create a sandbox and confirm its agent answers; retry up to start_attempts, and while the backend's engine
        does not answer, wait for it (up to engine_wait_s; those tries are not attempts). Raises SandboxStartError."""
        last: BaseException | None = None
        attempt, away_since, pause = 0, None, ENGINE_POLL_S[0]
        while attempt < self.start_attempts:
            try:
                return await self._start_once(spec)
            except SandboxEngineUnreachable as e:
                self._counters["failures"] += 1
                now = time.monotonic()
                away_since = now if away_since is None else away_since
                if now - away_since >= self.engine_wait_s:
                    raise SandboxStartError(f"the sandbox engine did not come back within engine_wait_s="
                                            f"{self.engine_wait_s:g}s: {e}") from e
                log.warning("sandbox engine unreachable (%s); starting again in %.1fs", e, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, ENGINE_POLL_S[1])
            except (SandboxError, OSError) as e:
                self._counters["failures"] += 1
                last, attempt = e, attempt + 1
                log.warning("sandbox start attempt %d/%d failed: %s", attempt, self.start_attempts, e)
        raise SandboxStartError(f"could not start a sandbox after {self.start_attempts} attempt(s): {last}") from last

    async def _start_once(self, spec: SandboxSpec, *, priority: bool = True) -> Sandbox:
        async with self._gate.slot(priority=priority):  # refills (priority=False) yield to leases
            return await self._start_admitted(spec)

    async def _start_admitted(self, spec: SandboxSpec) -> Sandbox:
        t0 = time.monotonic()
        try:
            assert self.backend is not None, "the pool is not entered"  # set by __aenter__
            async with asyncio.timeout(self.start_timeout_s):
                handle = await self.backend.create(spec, dict(self._labels))
        except TimeoutError:
            raise SandboxStartError(f"sandbox did not start within start_timeout_s={self.start_timeout_s}") from None
        sb = Sandbox(handle, spec)
        try:
            healthy = await sb.health()
        except BaseException:
            await self._dispose(sb)
            raise
        if not healthy:
            await self._dispose(sb)
            raise SandboxStartError(f"sandbox {handle.id} started but its agent does not answer health checks")
        self._timings["create_s"].append(handle.timings.get("create_s", time.monotonic() - t0))
        self._timings["agent_ready_s"].append(time.monotonic() - t0)
        return sb

    async def _dispose(self, sb: Sandbox) -> None:
        """Destroy `sb`; if the caller is cancelled meanwhile, the destroy still runs to the end."""
        task = self._destroy_later(sb)
        await asyncio.shield(task)

    def _destroy_later(self, sb: Sandbox) -> asyncio.Task[None]:
        task = asyncio.create_task(self._destroy(sb), name=f"sandbox-destroy-{sb.id}")
        self._destroys.add(task)
        task.add_done_callback(self._destroys.discard)
        return task

    async def _destroy(self, sb: Sandbox) -> None:
        try:
            await sb.close()
            assert self.backend is not None
            await self.backend.destroy(sb.handle)
            self._counters["destroyed"] += 1
        except Exception as e:  # never let teardown mask the lease's own outcome; the sweep retries later
            log.error("destroying sandbox %s failed: %s", sb.id, e)
            self._counters["failures"] += 1

    # ------------------------------------------------------------ refill

    def _warm_ready(self) -> int:
        return sum(len(ready) for ready in self._ready.values())

    def _next_refill(self) -> str | None:
        """The image the refiller should start next: the one furthest under its share of the warm target (the
        images of the last `warm` leases). When the warm set is full, a ready sandbox of an image over its share
        is destroyed to make room. None: nothing to do."""
        share = Counter(self._demand)
        have = Counter({img: len(ready) for img, ready in self._ready.items()}) + self._starting
        short = max(share, key=lambda img: share[img] - have[img])
        if share[short] - have[short] <= 0:
            return None
        cap = min(self.warm, self.max_sandboxes - len(self._active))
        if sum(have.values()) < cap:
            return short
        over = [img for img, ready in self._ready.items() if ready and have[img] > share[img]]
        if not over or sum(have.values()) > cap:
            return None
        victim = self._ready[max(over, key=lambda img: have[img] - share[img])].popleft()
        self._counters["evicted"] += 1
        self._destroy_later(victim)
        return short

    async def _refill_worker(self) -> None:
        backoff = 0.0
        while not self._closed:
            while (image := self._next_refill()) is None:
                self._need.clear()
                await self._need.wait()
            self._starting[image] += 1
            try:
                sb = await self._start_once(self.spec_for(image), priority=False)
            except (SandboxError, OSError) as e:
                self._counters["failures"] += 1
                backoff = min(30.0, max(0.5, backoff * 2))
                log.warning("warm refill failed (%s); retrying in %.1fs", e, backoff)
                await asyncio.sleep(backoff)
                continue
            finally:
                self._starting[image] -= 1
            backoff = 0.0
            self._ready.setdefault(image, deque()).append(sb)
            self._grew.set()

    async def fill(self, timeout_s: float | None = None) -> None:
        """Wait until `warm` sandboxes are ready (e.g. before a benchmark or the first rollout step)."""
        async with asyncio.timeout(timeout_s):
            while self._warm_ready() < self.warm:
                self._grew.clear()
                await self._grew.wait()

    # ------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        """Counters (leases, warm_hits, cold_starts, failures, replaced, destroyed, evicted), current sizes
        (active, warm_ready, starting; warm_by_image) and per-lease timing summaries (wait_s, create_s,
        agent_ready_s, lease_s)."""
        return {**self._counters, "active": len(self._active), "warm_ready": self._warm_ready(),
                "starting": sum(self._starting.values()),
                "warm_by_image": {img: len(ready) for img, ready in self._ready.items() if ready},
                **{k: _summary(v) for k, v in self._timings.items()}}
