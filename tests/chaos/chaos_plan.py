"""The chaos soak's plan: what each trajectory (task, sample) of a run is, decided before it starts, and the ids the
runner will give its attempts.

Every trajectory is, deterministically from the seed and at exact counts (round(rate * N)), one of:

    honest   writes the reference solution (and a marker file naming its trajectory), checks it, ends
    attack   one of ATTACKS: the one attack list of `agentrl.testing.scripted_attacks` (grader, workspace and
             sandbox attacks as hermes `run_python` calls, and its tool-call JSON attacks)
    fault    the honest script, and on its first attempt an outside fault (`fault_kinds(backend)`): from the host
             (chaos_faults.py), or from the engine / reward service (chaos_services.py)

The runner derives trajectory ids from the seed (`--deterministic`), so `Ids` maps each request's trajectory id back
to its (task, sample, attempt): the engine, the reward service and the injector know whom they serve.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentrl.runner.seeds import IdPlan
from agentrl.testing.scripted import hermes_call
from agentrl.testing.scripted_attacks import HERMES_JSON_ATTACKS, code_attacks

# run_python and each hidden test keep their default 10 s (at load 40+ on 2 cores an honest `add(1, 1)` test timed
# out after the former 3 s default)
ENV_OPTIONS = {"source": "easy", "action_format": "hermes"}
INFRA_RETRIES = 2
MARKER = "/workspace/.chaos"  # the policy's first command writes its trajectory id here: the host finds its sandbox
BUSY = "/workspace/.chaos-busy"  # written by a command that then sleeps: the host sees a command running
MAX_NEW_TOKENS = 6000
REWARD_WEIGHTS = {"unit_tests": 1.0, "http": 1.0}


def run_call(code: str) -> str:
    """A hermes `run_python` tool call running `code`: the policy's reply."""
    return hermes_call("run_python", code=code)


def attack_scripts(entry: str) -> dict[str, list[str]]:
    """name -> the policy's replies, one per turn, of every attack (code attacks wrapped as tool calls)."""
    return {**{name: [run_call(code) for code in blocks] for name, blocks in code_attacks(entry).items()},
            **HERMES_JSON_ATTACKS}


ATTACKS = sorted(attack_scripts("f"))
HOST_FAULTS = {  # fault kind -> the error kinds its first attempt may be recorded with (all infra)
    "local": {"sandbox_delete": ("sandbox_lost:deleted", "sandbox_lost:killed:9"),
              "bwrap_kill": ("sandbox_lost:killed:9",),
              "agent_kill": ("sandbox_died:signal:9",)},
    "docker": {"container_rm": ("sandbox_lost:deleted",),
               "container_kill": ("sandbox_died:signal:9", "sandbox_lost:killed:9"),
               "agent_kill": ("sandbox_died:signal:9",)},
}
TIMINGS = ("between", "in_command")  # the model is generating / the policy's command is running
SERVICE_FAULTS = {"engine_drop": ("engine",), "reward_503": ("reward_failed",)}
ABSORBED_FAULTS = ("engine_blip", "reward_blip")  # one request fails; the client's own retry absorbs it


def fault_kinds(backend: str) -> list[str]:
    host = [f"{k}@{t}" for k in HOST_FAULTS[backend] for t in TIMINGS]
    return host + list(SERVICE_FAULTS) + list(ABSORBED_FAULTS)


def expected_kinds(backend: str, fault: str) -> tuple[str, ...]:
    base = fault.split("@")[0]
    return HOST_FAULTS[backend].get(base) or SERVICE_FAULTS.get(base, ())


# -- the plan -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    task_id: str
    sample: int
    category: str  # honest | attack | fault
    name: str  # attack or fault kind ("" for honest)


def make_plan(task_ids: list[str], group_size: int, *, seed: int, attack_rate: float, fault_rate: float,
              backend: str, attacks: list[str] | None = None, faults: list[str] | None = None
              ) -> dict[tuple[str, int], Slot]:
    """Exact counts (round(rate * N)) of attacks and faults, each category cycling through its kinds (all, or the
    given subsets), shuffled over the (task, sample) pairs with `seed`: the rates are known, not sampled."""
    keys = [(t, k) for t in task_ids for k in range(group_size)]
    n_attack, n_fault = round(attack_rate * len(keys)), round(fault_rate * len(keys))
    if n_attack + n_fault > len(keys):
        raise SystemExit("--attack-rate + --fault-rate must be at most 1")
    attacks = attacks or ATTACKS
    faults = faults or fault_kinds(backend)
    unknown = sorted(set(attacks) - set(ATTACKS)) + sorted(set(faults) - set(fault_kinds(backend)))
    if unknown:
        raise SystemExit(f"unknown attack/fault {unknown} for backend {backend}; attacks: {ATTACKS}; "
                         f"faults: {fault_kinds(backend)}")
    labels = ([("attack", attacks[i % len(attacks)]) for i in range(n_attack)]
              + [("fault", faults[i % len(faults)]) for i in range(n_fault)]
              + [("honest", "")] * (len(keys) - n_attack - n_fault))
    random.Random(seed).shuffle(labels)
    return {key: Slot(key[0], key[1], cat, name) for key, (cat, name) in zip(keys, labels)}


class Ids:
    """Trajectory id -> (task, sample, attempt), as the runner derives them with `--deterministic --seed`."""

    def __init__(self, seed: int, task_ids: list[str], group_size: int) -> None:
        plan = IdPlan(seed)
        self.by_id: dict[str, tuple[str, int, int]] = {}  # trajectory id (any attempt) -> (task, sample, attempt)
        self.first: dict[tuple[str, int], str] = {}  # (task, sample) -> the id of its first attempt
        for t in task_ids:
            gid = plan.group_id(t, None, replica=0)
            for k in range(group_size):
                for attempt in range(INFRA_RETRIES + 1):
                    traj_id = plan.trajectory_id(gid, k, attempt)
                    self.by_id[traj_id] = (t, k, attempt)
                    if attempt == 0:
                        self.first[(t, k)] = traj_id

    def key(self, traj_id: str) -> tuple[str, int] | None:
        """(task, sample) of a trajectory id, None when it is not one of this plan's."""
        found = self.by_id.get(traj_id)
        return None if found is None else found[:2]

    def __getitem__(self, traj_id: str) -> tuple[str, int, int]:
        if traj_id not in self.by_id:
            raise KeyError(f"trajectory id {traj_id!r} is not one the runner derives from this seed")
        return self.by_id[traj_id]


