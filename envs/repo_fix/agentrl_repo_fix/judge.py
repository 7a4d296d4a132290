"""The judge of repo_fix's test verdicts, on the host: a process that never imports the graded code. It decides which
of the tests the graded run reported as passed really passed, from the records value_trace.py left for each test
(what the test's own checks compared, as digests of plain-data snapshots) and the records of the same test run on the
original package (the reference run, grading.reference_traces).

A test the graded run passed stands only if its records line up with the reference's: the same number, and each
record either identical to the reference's (same site, same operator, the same snapshot digests: the graded code
produced the original's data there, so the original's outcome applies), or plain (every operand and the result an
exact builtin value) with the judge's own recomputation from the shipped values agreeing, and at least one operand
the same as the reference's (the test's own side of the check). Everything else overturns the pass: a value of a
class the graded code made, compared by its own `__eq__` / `__bool__` / `__len__` / metaclass, holds the original's
data or earns nothing; a check that no longer runs (a loop over a rigged iterable) changes the count.

What it cannot see: values the graded code forges in its own process with knowledge of the expected answer (it can
read the test's source and frames there, like a hard-coded answer to a visible test), and checks made outside the
test files (helpers in modules pytest does not rewrite). A test with no reference records (the original failed it
in this run: a flaky test) keeps the graded run's verdict.
"""

from __future__ import annotations

import operator
from typing import Any

MAX_REASONS = 5
_REBUILD_ATOMS: dict[str, Any] = {"n": lambda v: None, "b": bool, "i": int, "f": float, "j": complex, "s": str,
                  "y": bytes.fromhex}
_OPS = {"Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
        "GtE": operator.ge, "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b}


class NotRebuildable(Exception):
    """A snapshot the judge cannot turn back into a value (hashed long text, a cycle, an object)."""


def rebuild(snap: list) -> Any:
    """The exact builtin value of a plain snapshot, built here from data (nothing of the graded code)."""
    kind = snap[0]
    if kind in _REBUILD_ATOMS:
        if kind == "i" and snap[1] == "big":
            raise NotRebuildable("an int of over 300 digits")
        return _REBUILD_ATOMS[kind](snap[1]) if kind != "n" else None
    if kind in ("l", "t", "S", "F"):
        items = [rebuild(x) for x in snap[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[kind](items)
    if kind == "d":
        return {rebuild(k): rebuild(v) for k, v in snap[1]}
    raise NotRebuildable(f"a snapshot of kind {kind!r}")


def recomputes(rec: list) -> bool:
    """True when the judge, from the record's shipped values alone, gets the result the graded run recorded."""
    if len(rec) < 7:
        return False
    kind, what, (operands, result) = rec[0], rec[2], rec[6]
    try:
        values = [rebuild(s) for s in operands]
        expected = rebuild(result)
        if kind == "K" and what in _OPS:
            got = _OPS[what](values[0], values[1])
        elif kind == "B":
            got = bool(values[0])
        else:
            return False
    except (NotRebuildable, TypeError, ValueError, OverflowError):
        return False
    return type(got) is type(expected) and got == expected


ANY = "*"  # a digest that differs between two runs of the original: any value matches it


def stable(first: list, second: list) -> list:
    """The records of one test from two runs of the original (same length), with each digest that differs
    between them replaced by ANY (a whole folded tail when its digest differs)."""
    out = []
    for a, b in zip(first, second):
        if a[0] == "R" or b[0] == "R" or a[:3] != b[:3]:
            out.append(a if a == b else [a[0], a[1], ANY, ANY, ANY, 0])
            continue
        operands = [x if x == y else ANY for x, y in zip(a[3], b[3])]
        out.append([*a[:3], operands, a[4] if a[4] == b[4] else ANY, a[5], *a[6:]])
    return out


def _same(mine: object, ref: object) -> bool:
    return ref == ANY or mine == ref


def _record_ok(mine: list, ref: list) -> bool:
    if mine[:6] == ref[:6]:
        return True
    if ref[2] == ANY and ref[0] != "R":  # a check whose very kind changed between the original's runs
        return mine[0] == ref[0] and mine[1] == ref[1]
    if mine[0] == "R":  # the folded tail of a long test: only its count and plainness can be compared
        return ref[0] == "R" and (ref[2] == ANY or (mine[1] == ref[1] and bool(mine[2])))
    if mine[:3] != ref[:3] or len(mine[3]) != len(ref[3]) or not _same(mine[4], ref[4]):
        return False  # another check, or another outcome
    if all(_same(a, b) for a, b in zip(mine[3], ref[3])):
        return True  # the original's own data (or values that vary on the original too)
    if not mine[5]:
        return False  # an object of the graded code's that does not hold the original's data
    same_side = any(a == b for a, b in zip(mine[3], ref[3]))
    if mine[0] == "A":  # a check function (unittest's assertEqual, isinstance) on plain values: trusted code
        return same_side
    return recomputes(mine) and (same_side or mine[0] == "B")


def overturned(passed: dict[str, bool], traces: dict[str, list], reference: dict[str, list]) -> dict[str, str]:
    """{test: why}: the tests the graded run passed whose checks do not hold against the reference."""
    out: dict[str, str] = {}
    for test, ok in passed.items():
        ref = reference.get(test)
        if not ok or ref is None:
            continue
        mine = traces.get(test)
        if mine is None:
            out[test] = "the test left no record of what it compared"
            continue
        if len(mine) != len(ref):
            out[test] = (f"the test made {len(mine)} checks where the original package's run made {len(ref)} "
                         "(a check skipped or added by the values the code returned)")
            continue
        for m, r in zip(mine, ref):
            if not _record_ok(m, r):
                out[test] = (f"the check at {m[1]} ({m[2] or m[0]}) compared values the original package does not "
                             "give there, and its outcome was decided by an object of the graded code "
                             "(rigged comparison)" if not m[5] else
                             f"the check at {m[1]} ({m[2] or m[0]}) does not hold on the values it saw")
                break
    return out
