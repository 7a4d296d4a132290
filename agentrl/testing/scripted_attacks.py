"""The attacks a hostile policy writes in its replies, against what scores it and the sandbox it runs in: the one list
that the rollout attack test (tests/integration/test_rollout_attacks.py), the chaos tier (tests/chaos/) and the chaos
benchmark (benchmarks/bench_chaos.py) draw from. Where an attack is also one of `sandbox_attacks` (run against the
control plane through `Sandbox.exec`), the code is that module's.

`code_attacks(entry)` gives each attack as a list of Python code blocks, one per model turn, in no reply format: a
test wraps each block the way its env's action format expects (a ```python fence, a hermes `run_python` call).
`entry` is the task's entry point (the function the grader calls). The families:

    grader      a solution.py that lies to the grader: an object equal to everything, an int subclass that lies,
                forged verdict lines on every descriptor then exit, sys.exit at import, os._exit or kill(-1) inside
                the call, patched builtins, planted sitecustomize / .pth / stdlib-named modules, kill(-1) right now
    workspace   solution.py that cannot be read as a file: a FIFO, a directory, a symlink out of the workspace, an
                unresolvable 1,200-link symlink chain, 80 MB
    sandbox     a fork bomb, a memory bomb, signalling the agent (KILL, STOP, TERM), a setsid daemon that keeps
                rewriting solution.py

`HERMES_JSON_ATTACKS` are whole replies for the hermes format: tool-call JSON a parser must survive (a 5,000-digit
integer, lone surrogates, 5,000-deep nesting). Every attack must end scored (never infra_error, never retried) with
reward 0. The grader family's solutions are `grader_attacks.CODE_TESTS_ATTACKS` (the ones every grading tier
runs); imports nothing but those and `sandbox_attacks`' code strings.
"""

from __future__ import annotations

from agentrl.testing.grader_attacks import CODE_TESTS_ATTACKS
from agentrl.testing.sandbox_attacks import AGENT_LOOKUP, KILL_EVERY_PROCESS, SYMLINK_CHAIN

FAMILIES = ("grader", "workspace", "sandbox")


def plant(src: str) -> str:
    """A code block that writes `src` as solution.py directly (not through the env's definition merge)."""
    return f"open('solution.py', 'w').write({src!r})\nprint('planted')"


def wrong(entry: str) -> str:
    return f"def {entry}(*args, **kwargs):\n    return object()\n"


def _solution(name: str, entry: str) -> str:
    """One of the grader hacks every grading tier runs (`grader_attacks.CODE_TESTS_ATTACKS`), for `entry`."""
    return CODE_TESTS_ATTACKS[name].replace("{f}", entry)


PLANTED_MODULES = """
import os
open('sitecustomize.py', 'w').write('import builtins\\nbuiltins.abs = lambda x: 0\\n')
open('usercustomize.py', 'w').write('import builtins\\nbuiltins.abs = lambda x: 0\\n')
open('evil.pth', 'w').write('import os; os._exit(0)\\n')
open('json.py', 'w').write('import os; os._exit(0)\\n')
open('math.py', 'w').write('import os; os._exit(0)\\n')
print('planted')
"""


def grader_attacks(entry: str) -> dict[str, list[str]]:
    return {
        "magic_eq": [plant(_solution("magic_eq_object", entry))],
        "lying_int_subclass": [plant(_solution("lying_int_subclass", entry))],
        "forged_verdicts_and_exit": [plant(_solution("forged_records_on_every_fd_then_exit_at_import", entry))],
        "sys_exit_at_import": [plant(_solution("sys_exit_0_at_import", entry))],
        "exit_inside_the_call": [plant(_solution("os_exit_0_inside_the_call", entry))],
        "kill_all_during_grading": [plant(f"import os\ndef {entry}(*args, **kwargs):\n    os.kill(-1, 9)\n")],
        "patch_builtins": [plant(_solution("monkeypatches_builtins_and_math", entry))],
        "planted_modules": [plant(wrong(entry)), PLANTED_MODULES],
        "kill_every_process_now": [plant(wrong(entry)), KILL_EVERY_PROCESS],
    }


# the control plane's symlink chain and loop (sandbox_attacks.attack_unresolvable_paths), with solution.py its end
SOLUTION_SYMLINK_CHAIN = (SYMLINK_CHAIN + "os.remove('solution.py')\nos.symlink('chain/1199', 'solution.py')\n"
                          "print('chain')")


def workspace_attacks(entry: str) -> dict[str, list[str]]:
    return {
        "solution_fifo": ["import os\nos.remove('solution.py')\nos.mkfifo('solution.py')\nprint('fifo')"],
        "solution_directory": ["import os\nos.remove('solution.py')\nos.mkdir('solution.py')\nprint('dir')"],
        "solution_symlink": ["import os\nos.remove('solution.py')\nos.symlink('/etc/hostname', 'solution.py')\n"
                             "print('link')"],
        "solution_symlink_chain": [plant(f"def {entry}(*args, **kwargs):\n    return args[0] if args else None\n"),
                                   SOLUTION_SYMLINK_CHAIN],
        "solution_huge": ["open('solution.py', 'w').write('# ' + 'x' * (80 * 1024 * 1024) + '\\n')\nprint('huge')"],
    }


# sends KILL, STOP and TERM to the agent (found as sandbox_attacks finds it); each must be refused
SIGNAL_THE_AGENT = AGENT_LOOKUP + """
found = agent_of()
print('agent', found)
for sig in (9, 19, 15):
    try:
        os.kill(found[0], sig)
    except (OSError, TypeError) as e:
        print('refused', e)
"""


def sandbox_attacks(entry: str) -> dict[str, list[str]]:
    daemon = ("import subprocess\nopen('d.py', 'w').write('import time\\nwhile True:\\n    "
              "open(\"solution.py\", \"w\").write(\"def " + entry + "(*a):\\\\n    return None\\\\n\")\\n    "
              "time.sleep(0.01)\\n')\nsubprocess.Popen(['setsid', 'python3', 'd.py'], "
              "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint('daemon started')")
    return {
        "fork_bomb": [plant(wrong(entry)), "import os\nwhile True:\n    try:\n        os.fork()\n"
                                           "    except OSError:\n        pass"],
        "memory_bomb": [plant(wrong(entry)), "x = []\nwhile True:\n    x.append(b'x' * (64 * 2**20))"],
        "signal_the_agent": [plant(wrong(entry)), SIGNAL_THE_AGENT],
        "daemon_rewrites_solution": [daemon],
    }


def code_attacks(entry: str, families: tuple[str, ...] = FAMILIES) -> dict[str, list[str]]:
    """name -> code blocks (one per turn) of every attack of `families`."""
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"code_attacks: unknown families {unknown}; known: {list(FAMILIES)}")
    make = {"grader": grader_attacks, "workspace": workspace_attacks, "sandbox": sandbox_attacks}
    out: dict[str, list[str]] = {}
    for family in families:
        out.update(make[family](entry))
    return out


_CALL = '<tool_call>\n{{"name": "run_python", "arguments": {{"code": "print(1)", "x": {x}}}}}\n</tool_call>'
HERMES_JSON_ATTACKS: dict[str, list[str]] = {
    "huge_integer_json": [_CALL.format(x="9" * 5000)],
    "lone_surrogates_json": ['<tool_call>\n{"name": "run_python", "arguments": {"code": '
                             '"open(\'solution.py\', \'w\').write(\'\\ud800\\udfff\\ud83d\')"}}\n</tool_call>',
                             '<tool_call>\n{"name": "run_python\\udc80", "arguments": {"code": "print(1)"}}\n'
                             '</tool_call>'],
    "deep_nesting_json": [_CALL.format(x="[" * 5000 + "]" * 5000)],
}
