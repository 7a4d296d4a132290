"""The cost of repo_fix's out-of-process judge (issue 31): the graded suite run with the verdict plugin alone (the
grader before the judge) vs with value_trace's records, plus the judge itself and the reference runs, measured on
the host as CPU seconds of the test process (user + sys: robust to a loaded machine) and wall seconds.

    PYTHONPATH=<tree>:<tree>/envs/repo_fix python benchmarks/bench_repo_fix_judge.py [--package inflection] [--runs 3]

Run it once with the tree before the judge on PYTHONPATH (its grader has no value_trace: "before") and once with
this tree ("after"); the script detects which it has. The suite runs over the task's original tree (every test
passes, so every record is judged), the way grading runs it: the plugin first, the grader's flags.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from agentrl_repo_fix import testrun, trees
from agentrl_repo_fix.env import RepoFixEnv


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(env: RepoFixEnv, row: dict, tree: trees.Tree) -> tuple[float, float, testrun.ChannelResult, bool]:
    tests = list(row["fail_to_pass"]) + list(row["pass_to_pass"])
    key = secrets.token_bytes(32)
    after = hasattr(testrun, "TRACE_SOURCE")
    with tempfile.TemporaryDirectory(prefix="bench-judge-") as tmp:
        repo, plug, home = Path(tmp, "repo"), Path(tmp, "plugin"), Path(tmp, "home")
        trees.write(tree, repo)
        plug.mkdir()
        home.mkdir()
        (plug / "agentrl_verdict_b.py").write_bytes(testrun.PLUGIN_SOURCE.read_bytes())
        kwargs: dict = {}
        extra: dict = {}
        if after:
            (plug / "agentrl_trace_b.py").write_bytes(testrun.TRACE_SOURCE.read_bytes())
            name, ini = testrun.grader_ini(tree)
            Path(tmp, name).write_bytes(ini)
            kwargs = {"grading": testrun.GradingPaths(ini=str(Path(tmp, name)), repo=str(repo), tmp=f"{tmp}/t")}
            extra = {"trace": "agentrl_trace_b", "tmp": f"{tmp}/t"}
        argv = testrun.pytest_argv(f"{env.venv(row)}/bin/python", list(row["tests"]), None,
                                   deselect=list(row.get("deselect", [])), plugin="agentrl_verdict_b", **kwargs)
        stdin = testrun.plugin_input(key, tests, str(repo), str(row["pythonpath"]), [], **extra)
        cpu0, t0 = _cpu(), time.perf_counter()
        proc = subprocess.run(argv, cwd=repo, input=stdin.encode(), capture_output=True,
                              env=testrun.suite_env(str(plug), str(home)), timeout=600)
        wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
        channel = testrun.read_channel(proc.stdout.decode(), key, tests, exit_code=proc.returncode)
    return wall, cpu, channel, after


def main(package: str, runs: int) -> None:
    env = RepoFixEnv(packages=[package])
    row = env.tasks()[0].data
    tree = trees.apply_diff(env.buggy(row), row["reference_diff"])
    walls, cpus, channels = [], [], []
    after = False
    for _ in range(runs):
        wall, cpu, channel, after = run_once(env, row, tree)
        walls.append(wall)
        cpus.append(cpu)
        channels.append(channel)
    out = {"package": package, "tests": len(row["fail_to_pass"]) + len(row["pass_to_pass"]),
           "grader": "after (value_trace + judge)" if after else "before", "runs": runs,
           "suite_wall_s_p50": round(statistics.median(walls), 3), "suite_cpu_s_p50": round(statistics.median(cpus), 3),
           "load": round(os.getloadavg()[0], 1)}
    if after:
        from agentrl_repo_fix import judge

        ref = {t: judge.stable(r, channels[1].traces.get(t, r)) for t, r in channels[0].traces.items()}
        t0 = time.process_time()
        verdicts = judge.overturned(channels[-1].passed, channels[-1].traces, ref)
        out["judge_cpu_s"] = round(time.process_time() - t0, 4)
        out["overturned"] = len(verdicts)
        out["records"] = sum(len(r) for r in channels[-1].traces.values())
        out["channel_bytes_per_test"] = round(sum(len(json.dumps(r)) for r in channels[-1].traces.values())
                                              / max(len(channels[-1].traces), 1))
    print(json.dumps(out))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", default="inflection")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    main(a.package, a.runs)
