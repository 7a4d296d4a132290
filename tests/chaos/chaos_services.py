"""The chaos soak's services, the only fakes of a run: the scripted model, served by the real SGLang stand-in with a
fault of its own, and the reward service.

    ChaosModel       every trajectory's policy, scripted by its slot (chaos_plan.py): honest, an attack, or honest
                     with a fault; a host fault's trajectory is where the injector (chaos_faults.py) is triggered
    DroppingFace     the SGLang stand-in with a middleware that resets the connection of chosen /generate requests:
                     `engine_drop` every request of one turn (past the client's retries), `engine_blip` one
    RewardService    an http reward source's service (reward = tests passed / total), answering 503 to every request
                     of a `reward_503` trajectory's first attempt, or to the first of a `reward_blip`
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

from aiohttp import web
from chaos_faults import FaultRecord, Injector
from chaos_plan import BUSY, MARKER, Ids, Slot, attack_scripts, run_call

from agentrl.engine.sglang import ROUTING_HEADER
from agentrl.engine.standin.sglang import StandIn
from agentrl.testing.scripted import ScriptedEngine

class ChaosModel:
    """The scripted policy of every trajectory, and where the host faults are triggered (a fault trajectory's second
    model turn on its first attempt: the sandbox has run the first command, the second is about to run)."""

    def __init__(self, tokenizer: Any, plan: dict[tuple[str, int], Slot], ids: Ids, tasks: dict[str, Any],
                 injector: Injector | None, *, mark_attacks: bool = False) -> None:
        self.plan, self.ids, self.tasks, self.injector = plan, ids, tasks, injector
        self.mark_attacks = mark_attacks  # dockerd restarts: an attack's first turn writes the marker too
        self.engine = _HookedEngine(tokenizer, self.reply, self.before, self.after)
        self._scripts = {t: attack_scripts(task.data["entry_point"]) for t, task in tasks.items()}
        self._pending: dict[str, tuple[FaultRecord, int]] = {}

    def slot(self, session: str) -> tuple[Slot, int]:
        task_id, k, attempt = self.ids[session]
        return self.plan[(task_id, k)], attempt

    def reply(self, session: str, turn: int, _ids: list[int]) -> str:
        if session not in self.ids.by_id:  # not a trajectory (e.g. a health probe)
            return "ok"
        slot, attempt = self.slot(session)
        if slot.category == "attack":
            turns = self._scripts[slot.task_id][slot.name]
            if self.mark_attacks:
                turns = [run_call(f"open({MARKER!r}, 'w').write({session!r})"), *turns]
            return turns[turn] if turn < len(turns) else "I am done."
        task = self.tasks[slot.task_id]
        if turn == 0:
            return run_call(f"open({MARKER!r}, 'w').write({session!r})\n{task.data['reference']}")
        if turn == 1:
            if attempt == 0 and slot.name.endswith("@in_command"):
                return run_call(f"import time\nopen({BUSY!r}, 'w').write('1')\ntime.sleep(4)\nprint('slept')")
            return run_call(f"print({task.data['entry_point']!r}, 'defined')")
        return "Done: the function is implemented."

    def _host_fault(self, session: str, turn: int) -> Slot | None:
        if session not in self.ids.by_id:
            return None
        slot, attempt = self.slot(session)
        hit = self.injector is not None and slot.category == "fault" and attempt == 0 and turn == 1 and "@" in slot.name
        return slot if hit else None

    async def before(self, session: str, turn: int) -> None:
        """A host fault's trajectory at its second model turn: find its sandbox now; `@between` hits it now (the
        next tool call finds it dead), `@in_command` once the reply's command runs."""
        if (slot := self._host_fault(session, turn)) is None:
            return
        assert self.injector is not None
        rec, agent = await self.injector.locate(session, slot)
        if agent is not None:
            if slot.name.endswith("@between"):
                await self.injector.hit(rec, agent)
            else:
                self._pending[session] = (rec, agent)

    async def after(self, session: str, turn: int) -> None:
        if (pending := self._pending.pop(session, None)) is not None:
            self.injector.later(self.injector.hit(*pending))  # type: ignore[union-attr]


class _HookedEngine(ScriptedEngine):
    def __init__(self, tokenizer: Any, reply: Any, before: Any, after: Any) -> None:
        super().__init__(tokenizer, reply)
        self._before, self._after = before, after

    def turn_of(self, session: str) -> int:
        return self._turns[session]

    async def generate(self, input_ids: list[int], sampling: Any, *, session_id: str) -> Any:
        turn = self._turns[session_id]
        await self._before(session_id, turn)
        gen = await super().generate(input_ids, sampling, session_id=session_id)
        await self._after(session_id, turn)
        return gen


class DroppingFace:
    """The SGLang stand-in with a middleware that resets the connection of chosen /generate requests (read, never
    answered: the client sees the server disconnect) — `engine_drop` every request of a fault trajectory's second
    turn on its first attempt (past the client's retries), `engine_blip` only the first one."""

    def __init__(self, standin: StandIn, model: ChaosModel, t0: float) -> None:
        self.standin, self.model, self.t0 = standin, model, t0
        self.drops: list[dict[str, Any]] = []
        self._blipped: set[str] = set()

    def app(self) -> web.Application:
        app = self.standin.app()
        app.middlewares.append(self._middleware)
        return app

    def _drop(self, session: str | None) -> bool:
        if not session or session not in self.model.ids.by_id:
            return False
        slot, attempt = self.model.slot(session)
        if slot.name not in ("engine_drop", "engine_blip") or attempt != 0 or self.model.engine.turn_of(session) != 1:
            return False
        if slot.name == "engine_blip":
            if session in self._blipped:
                return False
            self._blipped.add(session)
        return True

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        session = request.headers.get(ROUTING_HEADER)
        if request.path == "/generate" and self._drop(session):
            await request.read()
            self.drops.append({"traj_id": session, "t_s": time.perf_counter() - self.t0})
            if request.transport is not None:
                request.transport.abort()
            await asyncio.sleep(3600)  # cancelled when aiohttp sees the connection gone
        return await handler(request)


class RewardService:
    """An http reward source's service: reward = tests passed / total; 503 to every request of a `reward_503`
    fault's first attempt and to the first request of a `reward_blip`."""

    def __init__(self, model: ChaosModel) -> None:
        self.model = model
        self.answers: dict[str, list[int]] = defaultdict(list)
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/score", self._score)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}/score"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _score(self, request: web.Request) -> web.Response:
        body = await request.json()
        traj_id = body["trajectory_id"]
        status = 200
        if traj_id in self.model.ids.by_id:
            slot, attempt = self.model.slot(traj_id)
            if attempt == 0 and (slot.name == "reward_503" or (slot.name == "reward_blip"
                                                               and not self.answers[traj_id])):
                status = 503
        self.answers[traj_id].append(status)
        if status != 200:
            return web.json_response({"error": "overloaded (chaos)"}, status=status)
        tests = body.get("tests") or {}
        total = tests.get("total") or 0
        return web.json_response({"reward": (tests.get("passed", 0) / total) if total else 0.0})


