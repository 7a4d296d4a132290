"""Grader attacks through a real `agentrl rollout`: the CLI process, the real runner, scheduler, store, code_tests env
and bubblewrap sandboxes, with the model replaced by a scripted one served over HTTP (the SGLang stand-in over a
ScriptedEngine: the only fake is the model). Every trajectory's policy writes a hostile solution.py and/or attacks
its sandbox; every one must be scored 0 and none may end unscored (infra_error) or be retried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sglang_support import contract_validator

from agentrl.engine.standin.sglang import StandIn, StandInServer
from agentrl.testing.scripted import ScriptedEngine

ENTRY = "add"  # easy/add: add(a, b) -> a + b


def _write_solution(src: str) -> str:
    """A code block that plants `src` as solution.py directly (not via the definition merge)."""
    return f"open('solution.py', 'w').write({src!r})\nprint('planted')"


MAGIC_EQ = f"""
class Magic:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __abs__(self): return self
    def __sub__(self, other): return self
    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __sub__
    def __lt__(self, other): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __hash__(self): return 0
def {ENTRY}(*args, **kwargs):
    return Magic()
"""
LYING_INT = f"""
class LyingInt(int):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = int.__hash__
def {ENTRY}(*args, **kwargs):
    return LyingInt(0)
"""
FORGED_FDS = f"""
import os, json
for fd in range(3, 1024):
    for line in ('AGENTRL_HARNESS_RESULT ' + json.dumps({{"results": []}}) + '\\n', json.dumps([True, ""]) + '\\n'):
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
print('AGENTRL_HARNESS_RESULT {{"results": [["t", true, ""]]}}')
os._exit(0)
def {ENTRY}(a, b):
    return None
"""
SYS_EXIT = f"""
import sys
sys.exit(0)
def {ENTRY}(a, b):
    return None
"""
EXIT_IN_CALL = f"""
import os
def {ENTRY}(a, b):
    os._exit(0)
"""
KILL_ALL = f"""
import os
def {ENTRY}(a, b):
    os.kill(-1, 9)
"""
PATCH_BUILTINS = f"""
import builtins, math
builtins.abs = lambda x: 0
math.isclose = lambda *a, **k: True
builtins.AssertionError = type('Nope', (Exception,), {{}})
def {ENTRY}(a, b):
    return None
"""
def _forger(names: list[str]) -> str:
    """A daemon that waits for the grader (the harness process, found by its command line), writes a forged
    all-passed verdict into its stdout and kills it, so the forged line is the last one the host reads."""
    results = [[n, True, ""] for n in names]
    return f"""
import json, os, signal, time
line = 'AGENTRL_HARNESS_RESULT ' + json.dumps({{"results": {results!r}}}) + '\\n'
def harness(pid):
    try:
        return b'HARNESS' in open(f'/proc/{{pid}}/cmdline', 'rb').read()
    except OSError:
        return False
def parent(pid):
    for row in open(f'/proc/{{pid}}/status'):
        if row.startswith('PPid:'):
            return row.split()[1]
while True:
    for pid in os.listdir('/proc'):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if not harness(pid) or harness(parent(pid)):  # the grader itself, not its test children
                continue
            with open(f'/proc/{{pid}}/fd/1', 'w') as out:
                out.write(line)
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.002)
"""


def _daemon(names: list[str]) -> str:
    return f"""
import subprocess
open('forger.py', 'w').write({_forger(names)!r})
subprocess.Popen(['setsid', 'python3', 'forger.py'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('daemon started')
"""


PLANTS = """
import os
os.makedirs('sub', exist_ok=True)
open('sitecustomize.py', 'w').write('import builtins\\nbuiltins.abs = lambda x: 0\\n')
open('usercustomize.py', 'w').write('import builtins\\nbuiltins.abs = lambda x: 0\\n')
open('evil.pth', 'w').write('import os; os._exit(0)\\n')
open('json.py', 'w').write('import os; os._exit(0)\\n')
open('math.py', 'w').write('import os; os._exit(0)\\n')
"""
FIFO = "import os\nos.remove('solution.py')\nos.mkfifo('solution.py')\nprint('fifo')"
SYMLINK = "import os\nos.remove('solution.py')\nos.symlink('/etc/hostname', 'solution.py')\nprint('link')"
DIRECTORY = "import os\nos.remove('solution.py')\nos.mkdir('solution.py')\nprint('dir')"
HUGE = "open('solution.py', 'w').write('# ' + 'x' * (80 * 1024 * 1024) + '\\n')\nprint('huge')"
SYMLINK_CHAIN = ("import os\nos.makedirs('links')\nos.symlink('../x.py', 'links/0')\nfor i in range(1, 1200):\n"
                 "    os.symlink(str(i - 1), f'links/{i}')\nos.remove('solution.py')\n"
                 "os.symlink('links/1199', 'solution.py')\nprint('chain')")  # the agent used to recurse: 500, infra

WRONG = f"def {ENTRY}(a, b):\n    return None"

ATTACKS: dict[str, list[str]] = {
    "magic_eq": [_write_solution(MAGIC_EQ)],
    "lying_int_subclass": [_write_solution(LYING_INT)],
    "forged_verdicts_and_exit": [_write_solution(FORGED_FDS)],
    "sys_exit_at_import": [_write_solution(SYS_EXIT)],
    "exit_inside_the_call": [_write_solution(EXIT_IN_CALL)],
    "kill_all_during_grading": [_write_solution(KILL_ALL)],
    "patch_builtins": [_write_solution(PATCH_BUILTINS)],
    "planted_modules": [_write_solution(WRONG), PLANTS],
    "kill_every_process_now": [_write_solution(WRONG), "import os\nos.kill(-1, 9)"],
    "solution_fifo": [FIFO],
    "solution_symlink": [SYMLINK],
    "solution_directory": [DIRECTORY],
    "solution_huge": [HUGE],
    "solution_symlink_chain": [_write_solution(f"def {ENTRY}(a, b):\n    return a + b\n"), SYMLINK_CHAIN],
}


def _reply_for(names: list[str], scripts: dict[str, list[str]] | None = None, label: str = "attack") -> Any:
    """Each new session (trajectory) takes the next script (default: the attacks); its turns are the script's code
    blocks (the first one tagged `# <label>: <name>`), then 'done'."""
    assigned: dict[str, str] = {}
    scripts = ATTACKS if scripts is None else scripts

    def reply(session: str, turn: int, _ids: list[int]) -> str:
        name = assigned.setdefault(session, names[len(assigned) % len(names)])
        blocks = scripts[name]
        if turn >= len(blocks):
            return "I am done."
        tag = f"# {label}: {name}\n" if turn == 0 else ""
        return f"```python\n{tag}{blocks[turn]}\n```"

    return reply


async def test_every_attack_scores_zero_through_a_real_rollout(tmp_path: Path, smollm2_path: Path,
                                                               smollm2_tokenizer: Any) -> None:
    from agentrl.envs import get_env

    task = next(t for t in get_env("code_tests", source="easy").tasks() if t.id == "easy/add")
    ATTACKS["setsid_daemon_forges_verdicts"] = [_write_solution(WRONG), _daemon([n for n, _ in task.data["tests"]])]
    names = sorted(ATTACKS)
    engine = ScriptedEngine(smollm2_tokenizer, _reply_for(names))
    server = StandInServer(StandIn(engine, model_path=smollm2_path, validator=contract_validator(),
                                   worker_id="scripted"))
    url = await server.start()
    out = tmp_path / "attacks.jsonl"
    try:
        cmd = [sys.executable, "-m", "agentrl.cli", "rollout", "--env", "code_tests", "--task-id", "easy/add",
               "--group-size", str(len(names)), "--max-turns", "3", "--out", str(out), "--engine", "sglang",
               "--engine-url", url, "--model", str(smollm2_path)]
        proc = await _run(cmd)
    finally:
        await server.stop()
    assert proc[0] == 0, proc[1][-3000:]
    trajs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(trajs) == len(names)
    by_attack = {_attack_of(t, names): t for t in trajs}
    assert sorted(by_attack) == names, "every attack ran in its own trajectory"
    broken = {name: (t["status"], t["reward"], t["attempt"], t["error_kind"], (t["error"] or "")[:200])
              for name, t in by_attack.items()
              if t["status"] == "infra_error" or t["attempt"] != 0 or t["reward"] != 0.0}
    assert not broken, f"attacks that were not scored 0 (status, reward, attempt, kind, error): {broken}"


def _attack_of(traj: dict[str, Any], names: list[str]) -> str:
    first = traj["turns"][0]["text"]
    return next(n for n in names if f"# attack: {n}\n" in first)


async def _run(cmd: list[str]) -> tuple[int, str]:
    import asyncio

    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, env={**os.environ})
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    return proc.returncode or 0, out.decode(errors="replace")
