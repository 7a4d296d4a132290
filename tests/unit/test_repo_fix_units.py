"""repo_fix's pure parts: source-slicing mutations (every kind; untouched bytes unchanged), tree diffs that `git
apply` accepts both ways, which changes grading drops, JUnit parsing, the verdict plugin (the same ids and verdicts
as JUnit on a real pytest run of this venv; tampering it reports) and its channel checks, the all-or-nothing
verdict, task/lockfile validation and the seeded candidate order."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path
from typing import Any

import pytest
from agentrl_repo_fix import mutate, trees
from agentrl_repo_fix.build import TASK_FORMAT, _stable_msg, ordered_candidates
from agentrl_repo_fix.env import RepoFixEnv, load_tasks
from agentrl_repo_fix.grading import merge, protected, verdict
from agentrl_repo_fix.lockfile import load_lockfile
from agentrl_repo_fix.testrun import parse_junit

from agentrl.errors import ConfigError

SOURCE = textwrap.dedent('''\
    """Module docstring."""
    import re  # keep me


    def f(xs, n):
        """Doc."""
        total = 0   # odd   spacing kept
        for x in xs:
            if x > n and x != 3:
                total += x - n
        limit = int(n)
        name = "a".strip().lower()
        return total is not None, limit, name, True
    ''').encode()


def test_every_mutation_kind_applies_and_keeps_untouched_lines_byte_identical() -> None:
    found = mutate.candidates(SOURCE)
    kinds = {m.kind for m in found}
    assert kinds == set(mutate.KINDS), set(mutate.KINDS) - kinds
    original = SOURCE.splitlines()
    for m in found:
        new = mutate.apply(SOURCE, m)
        assert new != SOURCE
        compile(new, "<mutant>", "exec")
        changed = [ln for ln in new.splitlines() if ln not in original]
        # lines the mutation did not touch are byte-identical (comments and odd spacing survive)
        assert b"import re  # keep me" in new and b'"""Module docstring."""' in new, m
        assert len(changed) <= 4, (m, changed)
    assert mutate.candidates(SOURCE) == found  # deterministic


@pytest.mark.parametrize(("kind", "before", "after"), [
    ("invert_if", b"if x > n and x != 3:", b"if not (x > n and x != 3):"),
    ("change_operator", b"total += x - n", b"total += x + n"),
    ("swap_operands", b"total += x - n", b"total += n - x"),
    ("change_constant", b"total = 0   # odd   spacing kept", b"total = 1   # odd   spacing kept"),
    ("remove_wrapper", b"limit = int(n)", b"limit = n"),
    ("break_chain", b'name = "a".strip().lower()', b'name = "a".lower()'),
])
def test_mutation_examples(kind: str, before: bytes, after: bytes) -> None:
    outs = [mutate.apply(SOURCE, m) for m in mutate.candidates(SOURCE) if m.kind == kind]
    assert any(before in SOURCE and after in out and before not in out for out in outs), [o for o in outs][:3]


def test_remove_condition_dedents_the_body() -> None:
    outs = [mutate.apply(SOURCE, m) for m in mutate.candidates(SOURCE) if m.kind == "remove_condition"]
    assert any(b"    for x in xs:\n        total += x - n\n" in out for out in outs), outs


def test_seeded_candidate_order_is_reproducible_and_balanced() -> None:
    tree = {"m.py": SOURCE}
    a = ordered_candidates(tree, ["m.py"], random.Random("0:x"))
    b = ordered_candidates(tree, ["m.py"], random.Random("0:x"))
    c = ordered_candidates(tree, ["m.py"], random.Random("1:x"))
    assert a == b and a != c
    first = [m.kind for _, m in a[: len(mutate.KINDS)]]
    assert sorted(first) == sorted(mutate.KINDS)  # round-robin: one of each kind before any repeats


def test_diff_round_trips_through_git_apply_including_no_final_newline() -> None:
    old = {"a.py": b"x = 1\ny = 2\n", "b.txt": b"no newline", "gone.py": b"bye\n"}
    new = {"a.py": b"x = 1\ny = 3\n", "b.txt": b"no newline either", "new.py": b"hi\n"}
    patch = trees.diff(old, new)
    assert trees.apply_diff(old, patch) == new
    assert trees.apply_diff(new, patch, reverse=True) == old
    with pytest.raises(ValueError, match="does not apply"):
        trees.apply_diff(new, patch)


def test_tar_round_trip_is_deterministic_and_untrusted_archives_skip_links() -> None:
    tree = {"pkg/__init__.py": b"x = 1\n", "README": b"r"}
    assert trees.to_tar(tree) == trees.to_tar(dict(reversed(list(tree.items()))))
    assert trees.from_tar(trees.to_tar(tree)) == (tree, [])
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        link = tarfile.TarInfo("./evil")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        up = tarfile.TarInfo("../up.py")
        tar.addfile(up, io.BytesIO(b""))
    got, skipped = trees.from_tar(buf.getvalue())
    assert got == {} and sorted(skipped) == ["../up.py", "evil"]


@pytest.mark.parametrize(("path", "dropped"), [
    ("inflection/__init__.py", False), ("src/pkg/core.py", False), ("docs/conf.py", False),
    ("test_inflection.py", True), ("tests/test_x.py", True), ("pkg/tests/helpers.py", True),
    ("conftest.py", True), ("src/conftest.py", True), ("evil.pth", True), ("sitecustomize.py", True),
    ("setup.cfg", True), ("pyproject.toml", True), ("tox.ini", True), ("pytest.ini", True), ("setup.py", True),
    ("pkg/util_test.py", True), ("checks/extra.py", True),
])
def test_protected_paths(path: str, dropped: bool) -> None:
    assert (protected(path, ["test_inflection.py", "checks"]) is not None) is dropped


def test_merge_keeps_source_changes_and_drops_protected_ones() -> None:
    buggy = {"pkg/a.py": b"bug\n", "tests/test_a.py": b"assert f()\n", "pkg/b.py": b"b\n"}
    agent = {"pkg/a.py": b"fixed\n", "tests/test_a.py": b"pass\n", "conftest.py": b"import os\n", "x.pth": b"x"}
    graded, dropped = merge(buggy, agent, ["tests"])
    assert graded == {"pkg/a.py": b"fixed\n", "tests/test_a.py": b"assert f()\n"}  # pkg/b.py deleted by the agent
    assert dropped == {"tests/test_a.py": "test file", "conftest.py": "test/build configuration",
                       "x.pth": "path configuration (.pth)"}


JUNIT = b"""<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="t" name="ok"/>
<testcase classname="t" name="bad"><failure message="AssertionError: 1 != 2">trace</failure></testcase>
<testcase classname="t" name="err"><error message="boom"/></testcase>
<testcase classname="t" name="skip"><skipped/></testcase>
</testsuite></testsuites>"""


def test_parse_junit() -> None:
    r = parse_junit(JUNIT)
    assert r.passed == {"t::ok": True, "t::bad": False, "t::err": False}
    assert r.messages["t::bad"].startswith("AssertionError: 1 != 2")
    assert parse_junit(b"<not xml").error is not None


def test_verdict_is_all_or_nothing_with_the_f2p_fraction_as_detail() -> None:
    task = {"fail_to_pass": ["t::a", "t::b"], "pass_to_pass": ["t::c"]}
    good = verdict(task, {"t::a": True, "t::b": True, "t::c": True})
    assert (good.passed, good.total, good.outcomes[0].passed) == (1, 1, True)
    half = verdict(task, {"t::a": True, "t::b": False, "t::c": True})
    assert (half.passed, half.total) == (0, 1) and "fraction 0.500" in half.outcomes[0].message
    broke = verdict(task, {"t::a": True, "t::b": True})  # a PASS_TO_PASS test missing from the report = failed
    assert broke.passed == 0 and any(o.name == "PASS_TO_PASS::t::c" for o in broke.outcomes)
    assert verdict(task, {"t::a": True, "t::b": True, "t::c": True}, error="x").passed == 0


def test_task_file_and_lockfile_validation(tmp_path: Path) -> None:
    bad = tmp_path / "tasks.jsonl"
    bad.write_text(json.dumps({"format": "other"}) + "\n")
    with pytest.raises(ConfigError, match="rebuild"):
        load_tasks(bad, "all", [])
    with pytest.raises(ConfigError, match="does not exist"):
        load_tasks(tmp_path / "none.jsonl", "all", [])
    lock = tmp_path / "lock.toml"
    lock.write_text('format = 1\n[[package]]\nname = "x"\nversion = "1"\nsha256 = "zz"\nsplit = "train"\n'
                    'source = ["x"]\ntests = ["t"]\n')
    with pytest.raises(ConfigError, match="sha256"):
        load_lockfile(lock)
    with pytest.raises(ConfigError, match="not in the lockfile"):
        load_lockfile().select(["nope"])
    with pytest.raises(ConfigError, match="bash_timeout_s"):
        RepoFixEnv(bash_timeout_s=-1)


def test_committed_tasks_are_valid_and_split_by_package() -> None:
    env = RepoFixEnv()
    rows = env.rows()
    assert rows and all(r["format"] == TASK_FORMAT and r["fail_to_pass"] and r["pass_to_pass"] for r in rows)
    splits: dict[str, set[str]] = {}
    for r in rows:
        splits.setdefault(r["package"], set()).add(r["split"])
    assert all(len(s) == 1 for s in splits.values())  # a package is in train or eval, never both
    assert {r["id"] for r in RepoFixEnv(split="train").rows()} <= {r["id"] for r in rows}
    assert env.time_needs()["finalize"] <= 300 and env.time_needs()["tool_call"] <= 120  # the default budgets
    # the acceptance scale: >= 10 packages and >= 300 validated tasks; eval packages hold no train task
    assert len(splits) >= 10 and len(rows) >= 300
    train = {r["package"] for r in RepoFixEnv(split="train").rows()}
    evals = {r["package"] for r in RepoFixEnv(split="eval").rows()}
    assert train and evals and not train & evals


def test_failure_messages_are_normalized_to_what_is_stable_across_runs() -> None:
    raw = "at 0x7f3a2b1c4d50 took 1.25s in /tmp/pytest-of-root/pytest-124/test_cli0/x.sql"
    assert _stable_msg(raw) == "at 0x? took <t> in /tmp/pytest-of-root/pytest-N/test_cli0/x.sql"


SUITE = {
    "pkg/__init__.py": "def add(a, b):\n    return a + b\n",
    "tests/test_mod.py": textwrap.dedent("""\
        import unittest
        import pytest
        from pkg import add

        def test_ok():
            assert add(1, 2) == 3

        def test_bad():
            assert add(1, 2) == 4

        @pytest.mark.parametrize("x", ["a b", "c::d", "[e]"])
        def test_param(x):
            assert x

        class TestGroup:
            def test_in_class(self):
                assert True

        class Case(unittest.TestCase):
            def test_unit(self):
                self.assertEqual(add(2, 2), 4)

        @pytest.fixture
        def broken():
            raise RuntimeError("setup fails")

        def test_setup_error(broken):
            pass

        @pytest.mark.skip(reason="no")
        def test_skipped():
            pass

        @pytest.mark.xfail(reason="known")
        def test_xfail():
            assert False

        @pytest.fixture
        def bad_teardown():
            yield
            raise RuntimeError("teardown fails")

        def test_teardown_error(bad_teardown):
            pass

        def test_tmp_path(tmp_path):  # pytest 8.3 registers a lock cleanup through a saved atexit.register
            assert tmp_path.is_dir()
        """),
}


def _run_suite(tmp_path: Path, extra: str = "") -> tuple[dict, Any, str, int]:
    """The same suite through the JUnit report and through the verdict plugin (this venv's pytest)."""
    import secrets
    import subprocess
    import sys

    from agentrl_repo_fix.testrun import (PLUGIN_SOURCE, TRACE_SOURCE, plugin_input, pytest_argv, read_channel,
                                          suite_env)

    repo = tmp_path / "repo"
    for rel, text in SUITE.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text + (extra if rel == "pkg/__init__.py" else ""))
    plug = tmp_path / "plug"
    plug.mkdir()
    (plug / "agentrl_verdict_t.py").write_bytes(PLUGIN_SOURCE.read_bytes())
    (plug / "agentrl_trace_t.py").write_bytes(TRACE_SOURCE.read_bytes())
    report = tmp_path / "r.xml"
    subprocess.run(pytest_argv(sys.executable, ["tests"], str(report)), cwd=repo, capture_output=True,
                   env=suite_env(".", str(tmp_path)))
    junit = parse_junit(report.read_bytes()).passed
    ids = sorted(junit) + ["tests.test_mod::test_skipped", "tests.test_mod::test_xfail"]
    key = secrets.token_bytes(32)
    proc = subprocess.run(pytest_argv(sys.executable, ["tests"], None, plugin="agentrl_verdict_t"), cwd=repo,
                          input=plugin_input(key, ids, str(repo), ".", ["tests/test_mod.py"], trace="agentrl_trace_t",
                                             tmp=str(tmp_path / "tmp")).encode(),
                          capture_output=True, env=suite_env(str(plug), str(tmp_path)))
    stream = proc.stdout.decode()
    return junit, read_channel(stream, key, ids, exit_code=proc.returncode), stream, proc.returncode


def test_the_verdict_plugin_reports_what_the_junit_report_says(tmp_path: Path) -> None:
    junit, channel, stream, _ = _run_suite(tmp_path)
    assert channel.started and channel.tampered == [], channel.tampered
    assert channel.passed == junit  # same ids, same verdicts (skipped and xfailed left out, errors failed)
    assert junit["tests.test_mod::test_param[c::d]"] and not junit["tests.test_mod::test_teardown_error"]
    assert junit["tests.test_mod.Case::test_unit"] and not junit["tests.test_mod::test_setup_error"]
    assert "assert 3 == 4" in channel.messages["tests.test_mod::test_bad"]
    # S, per expected test that ran or skipped its value records (V) and its verdict (T), E
    assert stream.count("\n") == 2 + 2 * (len(junit) + 2)
    assert channel.traces["tests.test_mod::test_ok"][0][:3] == ["K", "tests/test_mod.py:6:11", "Eq"]


@pytest.mark.parametrize(("extra", "reason"), [
    ("import atexit\natexit.register(print)\n", "an atexit hook was registered from pkg/__init__.py"),
    ("import sys\nsys.modules['_pytest.runner'].call_and_report = lambda *a, **k: None\n",
     "_pytest.runner.call_and_report was changed at run time"),
    ("import sys\nsys.modules['_pytest.python'] = type(sys)('fake')\n",
     "the harness module _pytest.python was replaced in sys.modules"),
    ("import sys\nsys.settrace(lambda *a: None)\n", "a trace or profile function is installed"),
    ("import sys\nsys.modules['_pytest.reports'].TestReport.passed = property(lambda self: True)\n",
     "_pytest.reports.TestReport.passed was changed at run time"),  # shadows BaseReport.passed
])
def test_the_plugin_reports_tampering_by_the_code_under_test(tmp_path: Path, extra: str, reason: str) -> None:
    _, channel, _, _ = _run_suite(tmp_path, extra)
    assert channel.started and reason in channel.tampered, channel.tampered


def _signed(key: bytes, records: list[list]) -> str:
    """A stream as the plugin (or code that got hold of its key) writes it."""
    import hashlib
    import hmac

    out = []
    for seq, rec in enumerate(records):
        body = f"{seq}\t{json.dumps(rec)}"
        out.append(f"{body}\t{hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:32]}\n")
    return "".join(out)


def test_the_channel_rejects_forged_duplicated_late_and_missing_lines() -> None:
    from agentrl_repo_fix.testrun import read_channel

    key, ids = b"k" * 32, ["t::a", "t::b"]
    good = [["S", 2], ["T", 0, "p"], ["T", 1, "f", "boom"], ["E", 2, 1]]

    def read(text: str, code: int | None = 1, truncated: bool = False):  # type: ignore[no-untyped-def]
        return read_channel(text, key, ids, exit_code=code, truncated=truncated)

    ok = read(_signed(key, good))
    assert (ok.started, ok.tampered, ok.passed, ok.messages) == (True, [], {"t::a": True, "t::b": False},
                                                               {"t::b": "boom"})
    assert not read("").started and not read(_signed(b"x" * 32, good)).started  # the plugin never spoke
    stream = _signed(key, good)
    lines = stream.splitlines(keepends=True)
    assert "not written by the grader" in read(lines[0] + lines[1] + lines[1] + "".join(lines[2:])).tampered[0]
    forged = lines[0] + "1\t[\"T\", 1, \"p\"]\t" + "0" * 32 + "\n" + "".join(lines[2:])
    assert "not written by the grader" in read(forged).tampered[0]
    dup = read(_signed(key, [good[0], good[1], ["T", 0, "p"], good[2], good[3]]))
    assert dup.tampered == ["t::a was reported twice"] and dup.passed["t::a"] is False
    late = read(_signed(key, [*good, ["T", 1, "p"]]))
    assert "after the grader's end line" in late.tampered[0]
    assert "before the grader's end line" in read(_signed(key, good[:3])).tampered[0]
    assert read(_signed(key, good[:3]), None).tampered == []  # killed at the suite timeout: scored as a timeout
    assert "exited 0 after the grader saw exit status 1" in read(stream, 0).tampered[0]
    assert "overflowed" in read(stream, truncated=True).tampered[0]
    assert "partial line" in read(stream + "4\t[").tampered[0]
    assert read(_signed(key, [*good[:3], ["X", "os._exit(0) called from pkg/a.py"], good[3]])).tampered == \
        ["os._exit(0) called from pkg/a.py"]


def test_local_backend_gets_the_envs_read_only_binds() -> None:
    from agentrl.compose import env_backend_options

    class WithBinds:
        def ro_binds(self) -> list[str]:
            return ["/opt/venv-a"]

    assert env_backend_options("local", WithBinds()) == {"ro_binds": ["/opt/venv-a"]}  # type: ignore[arg-type]
    assert env_backend_options("docker", WithBinds()) == {}  # type: ignore[arg-type]
    assert env_backend_options("local", object()) == {}  # type: ignore[arg-type]
    assert env_backend_options("local", None) == {}


def test_a_cached_sdist_with_the_wrong_hash_is_refused(tmp_path: Path) -> None:
    from agentrl_repo_fix.lockfile import fetch_sdist

    (pkg,) = load_lockfile().select(["inflection"])
    (tmp_path / "sdists").mkdir()
    (tmp_path / "sdists" / f"{pkg.key}.tar.gz").write_bytes(b"tampered")
    with pytest.raises(ConfigError, match="sha256 .* != lockfile's"):
        fetch_sdist(pkg, tmp_path)
