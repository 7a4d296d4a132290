"""The chaos soak's verdicts on one run (`judge`): counts, the invariants, and every trajectory that breaks one.

Invariants (per backend): trajectories lost (requested - stored) = 0 and the run completes; every injected fault that
is not absorbed inside a client is recorded as infra_error (the CLI's retry log names its error_kind) and retried to a
clean, fully scored record (a reward service that keeps failing may instead leave the record unscored, infra_error
reward_failed with reward None, after the source's own retries: never a 0); absorbed blips leave an ok record with
the honest reward and show the retry on the server side; every attack is scored (never infra_error, never retried,
reward 0); honest trajectories get the full reward. With dockerd restarts, every attempt in flight at a restart is
recorded infra_error and retried to a score, or was done with its sandbox (`restart_outcomes`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict
from typing import Any

from chaos_dockerd import RestartRecord
from chaos_faults import FaultRecord
from chaos_plan import ABSORBED_FAULTS, REWARD_WEIGHTS, Slot, expected_kinds
from chaos_run import RunResult

def honest_reward() -> float:
    return sum(REWARD_WEIGHTS.values())


def judge(run: RunResult, plan: dict[tuple[str, int], Slot], *, restarts_expected: bool = False) -> dict[str, Any]:
    """Per-backend report: counts, the invariants, and every trajectory that breaks one (with its error_kind).
    With dockerd restarts, a trajectory may have more attempts than its category's own: each extra one must be an
    infra_error the restarts caused (`restart_attempts`), and `restart_outcomes` judges every attempt in flight at a
    restart."""
    stored: dict[tuple[str, int], dict[str, Any]] = {}
    dupes = 0
    for t in run.trajectories:
        key = (t["task_id"], t["sample_index"])
        dupes += key in stored
        stored[key] = t
    infra_by_key: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    for traj_id, _task, kind, attempt in run.infra_log:
        key = run.ids.key(traj_id)
        if key is not None:
            infra_by_key[key].append((kind, attempt))
    faults_by_key = {(r.task_id, r.sample): r for r in run.faults}
    drops_by_id = Counter(d["traj_id"] for d in run.drops)
    affected, unmapped = in_flight_at_restarts(run.restarts, run.sandbox_of)
    by_restart = restart_attempts(run.infra_log, affected, run.ids.by_id) if run.restarts else {}
    report: dict[str, Any] = {
        "backend": run.backend, "requested": run.requested, "stored": len(stored), "duplicates": dupes,
        "lost": run.requested - len(stored), "rc": run.rc, "wall_s": round(run.wall_s, 1),
        "final_infra_error": sum(t["status"] == "infra_error" for t in stored.values()), "load": run.load,
    }
    honest: dict[str, Any] = {"n": 0, "ok": 0, "bad": []}
    attacks: dict[str, dict[str, Any]] = {}
    faults: dict[str, dict[str, Any]] = {}
    for key, slot in sorted(plan.items()):
        t = stored.get(key)
        if slot.category == "honest":
            honest["n"] += 1
            if t and _scored_right(slot, t) and _only_restart_retries(t, by_restart.get(key, set())):
                honest["ok"] += 1
            else:
                honest["bad"].append(_brief(key, t, infra_by_key.get(key)))
        elif slot.category == "attack":
            a = attacks.setdefault(slot.name, {"n": 0, "scored": 0, "bad": []})
            a["n"] += 1
            if t and _scored_right(slot, t) and _only_restart_retries(t, by_restart.get(key, set())):
                a["scored"] += 1
            else:
                a["bad"].append(_brief(key, t, infra_by_key.get(key)))
        else:
            f = faults.setdefault(slot.name, {"n": 0, "injected": 0, "handled": 0, "kinds": Counter(), "bad": [],
                                              "expected_kinds": list(expected_kinds(run.backend, slot.name))})
            f["n"] += 1
            ok, injected, kinds = _fault_outcome(run, slot, t, infra_by_key.get(key, []), faults_by_key.get(key),
                                                 drops_by_id)
            if 0 in by_restart.get(key, set()):  # a restart took its first attempt: the fault may never have come
                f["preempted_by_restart"] = f.get("preempted_by_restart", 0) + 1
                ok = bool(t and _scored_right(slot, t) and _only_restart_retries(t, by_restart[key]))
            f["injected"] += injected
            f["kinds"].update(kinds)
            if ok:
                f["handled"] += 1
            else:
                rec = faults_by_key.get(key)
                f["bad"].append({**_brief(key, t, infra_by_key.get(key)),
                                 "fault": asdict(rec) if rec else None})
    for f in faults.values():
        f["kinds"] = dict(f["kinds"])
    n_fault = sum(f["n"] for f in faults.values())
    n_attack = sum(a["n"] for a in attacks.values())
    report.update({
        "honest": honest, "attacks": attacks, "faults": faults,
        "faults_injected": sum(f["injected"] for f in faults.values()), "faults_planned": n_fault,
        "faults_handled": sum(f["handled"] for f in faults.values()),
        "attacks_planned": n_attack, "attacks_scored": sum(a["scored"] for a in attacks.values()),
    })
    report["invariants"] = {
        "no_trajectory_lost": report["lost"] == 0 and run.rc == 0,
        "faults_infra_and_retried": report["faults_handled"] == n_fault,
        "attacks_scored": report["attacks_scored"] == n_attack,
        "honest_scored_in_full": honest["ok"] == honest["n"],
        "run_completed": run.rc == 0,
    }
    if restarts_expected or run.restarts:
        r = restart_outcomes(sorted(affected), run.ids.by_id, plan, stored, infra_by_key)
        extra = sum(len(v) for v in by_restart.values())
        r.update({"restarts": len(run.restarts), "restart_failures": [x.note for x in run.restarts if x.note],
                  "marked": sum(len(x.affected) for x in run.restarts),
                  "unmarked_leased": sum(len(x.unmarked_leased) for x in run.restarts),
                  "unmarked_unmapped": unmapped,
                  "warm": sum(x.warm for x in run.restarts),
                  "down_s": [x.down_s for x in run.restarts],
                  "restart_infra_attempts": extra,
                  "restart_infra_attempts_unidentified": extra - r["infra_retried_scored"]})
        report["dockerd_restarts"] = r
        report["invariants"]["dockerd_restarts_infra_and_retried"] = (
            r["restarts"] >= 1 and not r["restart_failures"] and not r["bad"] and not unmapped
            and r["infra_retried_scored"] + r["done_before_death"] == r["affected"])
    if run.rc != 0:
        report["stderr_tail"] = run.stderr_tail
    return report


# what a dockerd restart leaves on the attempt it hits: in flight, the engine's socket refuses (engine_lost) or, asked
# while dockerd stops its containers, the container ended on SIGTERM (killed:15); a lease or env setup while the
# engine is away fails to start a sandbox
RESTART_KINDS = ("sandbox_lost:engine_lost", "sandbox_lost:killed:15", "sandbox_start", "lease_failed",
                 "setup_failed")


def in_flight_at_restarts(restarts: list[RestartRecord], sandbox_of: dict[str, str]) -> tuple[set[str], list[str]]:
    """The attempts whose sandbox was running when dockerd got SIGTERM: those whose marker the snapshot read, and
    those whose leased sandbox had no marker yet, found by the sandbox their error names (such an attempt cannot
    end without an error: its first command, grading and all, needed the sandbox that died). Also returns the
    unmarked sandboxes no attempt's error names (each should be none)."""
    attempt_of = {name: traj_id for traj_id, name in sandbox_of.items()}
    affected = {traj_id for r in restarts for traj_id in r.affected}
    unmapped = []
    for r in restarts:
        for name in r.unmarked_leased:
            if name in attempt_of:
                affected.add(attempt_of[name])
            else:
                unmapped.append(name)
    return affected, unmapped


def restart_attempts(infra_log: list[tuple[str, str, str, int]], affected: set[str],
                     attempts: dict[str, tuple[str, int, int]]) -> dict[tuple[str, int], set[int]]:
    """(task, sample) -> its attempts that a dockerd restart ended: recorded infra_error (the retry log) and either in
    flight at a restart (`affected`: their marker was in a container when dockerd got SIGTERM) or with a kind only a
    missing engine gives (RESTART_KINDS: a lease or setup while it was away, a command between the snapshot and the
    SIGTERM)."""
    out: dict[tuple[str, int], set[int]] = defaultdict(set)
    for traj_id, _task, kind, attempt in infra_log:
        if traj_id in attempts and (traj_id in affected or kind in RESTART_KINDS):
            task, k, _ = attempts[traj_id]
            out[(task, k)].add(attempt)
    return dict(out)


def _only_restart_retries(t: dict[str, Any], restart_hit: set[int]) -> bool:
    """The record's earlier attempts are exactly those a restart ended (none without restarts: attempt 0)."""
    return restart_hit == set(range(t["attempt"]))


def _scored_right(slot: Slot, t: dict[str, Any]) -> bool:
    """Honest (and fault) runs: ok with the full reward; attacks: scored, reward 0."""
    if slot.category == "attack":
        return t["status"] != "infra_error" and t["reward"] == 0.0
    return t["status"] == "ok" and _close(t["reward"], honest_reward())


def restart_outcomes(affected: list[str], attempts: dict[str, tuple[str, int, int]], plan: dict[tuple[str, int], Slot],
                     stored: dict[tuple[str, int], dict[str, Any]],
                     infra_by_key: dict[tuple[str, int], list[tuple[str, int]]]) -> dict[str, Any]:
    """Each attempt in flight at a restart (its sandbox was in the engine that got SIGTERM) is one of:
    `infra_retried_scored` - recorded infra_error (kind counted) and a later attempt scored right;
    `done_before_death` - it needed its sandbox no more (grading done as dockerd stopped): its own record is the
    final one, scored right, and no sandbox death is in it;
    `bad` - anything else: lost, left unscored, charged to the policy (a sandbox death as policy_error, reward 0)."""
    out: dict[str, Any] = {"affected": 0, "infra_retried_scored": 0, "done_before_death": 0, "kinds": Counter(),
                           "bad": []}
    for traj_id in sorted(set(affected)):
        task, k, a = attempts[traj_id]
        slot, t = plan[(task, k)], stored.get((task, k))
        out["affected"] += 1
        kinds = [kind for kind, attempt in infra_by_key.get((task, k), []) if attempt == a]
        if t is not None and kinds and t["attempt"] > a and _scored_right(slot, t):
            out["infra_retried_scored"] += 1
            out["kinds"].update(kinds)
        elif (t is not None and not kinds and t["attempt"] == a and _scored_right(slot, t)
              and not (t["error_kind"] or "").startswith("sandbox_died")):
            out["done_before_death"] += 1
        else:
            out["bad"].append({"traj_id": traj_id, "category": slot.category, "name": slot.name,
                               **_brief((task, k), t, infra_by_key.get((task, k)))})
    out["kinds"] = dict(out["kinds"])
    return out


def _fault_outcome(run: RunResult, slot: Slot, t: dict[str, Any] | None, infra: list[tuple[str, int]],
                   rec: FaultRecord | None, drops: Counter[str]) -> tuple[bool, int, list[str]]:
    """(handled as the issue requires, the fault was injected, the error kinds recorded for it).

    Handled: the attempt the fault hit was recorded infra_error (the runner's retry log names its kind) and a retry
    ended ok with the honest reward; or, for the reward service, the source retried the scoring and the record
    stayed unscored (infra_error reward_failed, reward None: never a 0) without re-running the episode; or, for a
    blip, the client's own retry absorbed it (ok, attempt 0, the honest reward, the server saw the failed request)."""
    first = run.ids.first.get((slot.task_id, slot.sample), "")
    if slot.name in ABSORBED_FAULTS:
        seen = drops[first] if slot.name == "engine_blip" else run.reward_answers.get(first, []).count(503)
        full = t is not None and t["status"] == "ok" and _close(t["reward"], honest_reward())
        ok = full and t is not None and t["attempt"] == 0 and seen == 1
        return ok, int(seen > 0), ["absorbed_by_client_retry"] if seen else []
    if "@" in slot.name:
        injected = int(rec is not None and rec.delivered)
    elif slot.name == "engine_drop":
        injected = int(drops[first] > 0)
    else:
        injected = int(503 in run.reward_answers.get(first, []))
    if t is None:
        return False, injected, [k for k, attempt in infra if attempt == 0]
    full = t["status"] == "ok" and _close(t["reward"], honest_reward())
    kinds = [k for k, attempt in infra if attempt == 0]
    if t["status"] == "infra_error" and t["attempt"] == 0:
        kinds.append(t["error_kind"] or "")
    retried_episode = bool(kinds) and full and t["attempt"] >= 1
    unscored_rescored = (slot.name == "reward_503" and t["status"] == "infra_error" and t["attempt"] == 0
                         and t["error_kind"] == "reward_failed" and t["reward"] is None
                         and run.reward_answers.get(first, []).count(503) >= 2)
    return bool(injected and (retried_episode or unscored_rescored)), injected, kinds


def _close(x: Any, y: float) -> bool:
    return x is not None and abs(float(x) - y) < 1e-9


def _brief(key: tuple[str, int], t: dict[str, Any] | None, infra: list[tuple[str, int]] | None) -> dict[str, Any]:
    if t is None:
        return {"task": key[0], "sample": key[1], "stored": False, "earlier_attempts": infra or []}
    return {"task": key[0], "sample": key[1], "status": t["status"], "attempt": t["attempt"], "reward": t["reward"],
            "error_kind": t["error_kind"], "error": (t["error"] or "")[:240], "earlier_attempts": infra or []}


