"""What the task's tests compared, as plain data: shipped next to the verdict plugin into the grading sandbox (random
module name, standard library only) and loaded by it before any file of the graded repository can run.

The plugin has pytest's assertion rewriter also pass every test module and conftest through `instrument`, which
routes the checks the test's own code makes through this module:
  - every single-operator comparison (`a == b`, `x in y`, `r is None`, ...) -> `cmp`;
  - every `not X` (pytest's rewritten `assert X` is `if not X: raise`) -> `truth` (`__bool__` / `__len__`);
  - every call of isinstance / issubclass / len / bool / all / any / hash / callable and of any function whose
    name starts with `assert`, `raises` or `warns` (unittest's `self.assertEqual`, `pytest.raises`) -> `call`;
    a context manager such a call returns also records, at its exit, the class of what its block raised.
Each check still runs as written (same result, same number of calls into the graded code); it also leaves a record:
the check's site (file:line:col), its operator or function, a digest of each operand's snapshot and of the result,
whether all of them are plain data, and for plain records the snapshot itself.

A snapshot never runs the graded code: exact builtin types are read as values (`type(x) is int`, with `type`
captured at import); any other object becomes its class's module and qualified name plus its instance `__dict__`
and slots, read through the C-level descriptors found on its MRO (a class that replaced them is "unreadable").
Such a record is not plain: the judge (judge.py, on the host) accepts it only if it equals the record the original
package produced at the same point of the same test, so a value whose own methods decide a comparison earns nothing
unless it holds the original's data. This module only observes; what it records is believed only as far as the
judge's rules go (the graded code shares this process and can write here too: see judge.py).
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
import types
from typing import Any

_type, _id, _len, _bool, _repr = type, id, len, bool, repr
_QUAL = type.__dict__["__qualname__"].__get__
_MODULE = type.__dict__["__module__"].__get__
_MRO = type.__dict__["__mro__"].__get__
_TDICT = type.__dict__["__dict__"].__get__
_GETSET = _type(type.__dict__["__qualname__"])
_MEMBER = _type(type.__dict__["__basicsize__"])
_GETSET_GET, _MEMBER_GET = _GETSET.__get__, _MEMBER.__get__
_INT_REPR, _FLOAT_REPR, _COMPLEX_REPR = int.__repr__, float.__repr__, complex.__repr__
# keyed by id: hashing or comparing a class the graded code made would run its metaclass's methods
_ATOMS = {_id(t): k for t, k in ((_type(None), "n"), (bool, "b"), (int, "i"), (float, "f"), (complex, "j"),
                                 (str, "s"), (bytes, "y"))}
_CONTAINERS = {_id(t): k for t, k in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F"), (dict, "d"))}
_METHOD, _FUNCTION = types.MethodType, types.FunctionType
_METHOD_FUNC = types.MethodType.__dict__["__func__"]
_FUNC_TYPES: tuple[Any, ...] = (_type(len), _type(lambda: 0), _type([].append), _type(_type.mro),
                                _type(object.__init__))
_FUNCS = {_id(t) for t in _FUNC_TYPES}
OPS = {"Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
       "GtE": operator.ge, "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b, "Is": operator.is_,
       "IsNot": operator.is_not}
WATCHED = {"isinstance", "issubclass", "len", "bool", "all", "any", "hash", "callable"}
WATCHED_PREFIXES = ("assert", "raises", "warns")
MAX_NODES, MAX_DEPTH, MAX_STR = 4000, 12, 4096
# a test's records on the channel: kept one by one up to MAX_LINE_BYTES (plain values shipped while they fit), the
# rest folded into one digest; grading.CHANNEL_BYTES_PER_TEST bounds what the sandbox's agent buffers per test
MAX_LINE_BYTES, MAX_PAYLOAD = 12 * 1024, 1024
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,16}")
_state: dict = {"on": False, "records": [], "rest": None, "bytes": 0, "repo": "\0", "tmp": "\0"}


def configure(repo: str, tmp: str) -> None:
    """Paths that differ between the graded and the reference run; strings show them as <repo> / <tmp>."""
    _state["repo"], _state["tmp"] = repo, tmp


def _text(s: str) -> list:
    if "/" in s or "0x" in s:
        s = s.replace(_state["repo"], "<repo>").replace(_state["tmp"], "<tmp>")
        s = _ADDRESS.sub("0x?", s)
    if _len(s) > MAX_STR:
        return ["s#", _len(s), hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()]
    return ["s", s]


class _Snap:
    """One snapshot: the plain-data form of a value; `plain` stays True while only exact builtin types were seen."""

    def __init__(self) -> None:
        self.nodes, self.plain = 0, True
        self.path: set[int] = set()

    def of(self, v: object, depth: int = 0) -> list:
        self.nodes += 1
        t = _type(v)
        kind = _ATOMS.get(_id(t))
        if kind is not None:
            return self._atom(kind, v)
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            self.plain = False
            return ["~"]
        if _id(v) in self.path:  # a cycle (a value shared, not nested, is snapshot again: the same in any order)
            self.plain = False
            return ["@"]
        self.path.add(_id(v))
        try:
            return self._composite(v, t, depth)
        finally:
            self.path.discard(_id(v))

    def _composite(self, v: Any, t: type, depth: int) -> list:
        kind = _CONTAINERS.get(_id(t))
        if kind in ("l", "t"):
            return [kind, [self.of(x, depth + 1) for x in (list.__iter__(v) if kind == "l" else tuple.__iter__(v))]]
        if kind in ("S", "F"):
            items = [self.of(x, depth + 1) for x in (set.__iter__(v) if kind == "S" else frozenset.__iter__(v))]
            return [kind, sorted(items, key=json.dumps)]
        if kind == "d":
            return ["d", [[self.of(k, depth + 1), self.of(x, depth + 1)] for k, x in dict.items(v)]]
        self.plain = False
        return self._object(v, t, depth)

    def _atom(self, kind: str, v: object) -> list:
        if kind == "s":
            return _text(v)  # type: ignore[arg-type]
        if kind == "i":
            return ["i", _INT_REPR(v) if -(10 ** 300) < v < 10 ** 300 else "big"]  # type: ignore[operator]
        if kind == "f":
            return ["f", _FLOAT_REPR(v)]
        if kind == "j":
            return ["j", _COMPLEX_REPR(v)]
        if kind == "y":
            return ["y", v.hex() if _len(v) <= MAX_STR else hashlib.sha256(v).hexdigest()]  # type: ignore
        return [kind, v]

    def _object(self, v: object, t: type, depth: int) -> list:
        name = f"{_MODULE(t)}.{_QUAL(t)}"
        if any(c is type for c in _MRO(t)):  # a class: by name (its metaclass is not consulted)
            return ["c", f"{_MODULE(v)}.{_QUAL(v)}"]  # type: ignore[arg-type]
        if _id(t) in _FUNCS:
            return ["fn", name, _text(v.__qualname__)]  # type: ignore[attr-defined]
        if t is _METHOD:  # a bound method: its function's name (not the state of the object it is bound to)
            func = _MEMBER_GET(_METHOD_FUNC, v, t)
            return ["fn", name, _text(func.__qualname__) if _type(func) is _FUNCTION else ["?"]]
        state: list = []
        for cls in _MRO(t):
            space = _TDICT(cls)
            for key in sorted(k for k in dict.keys(space.copy()) if _type(k) is str):
                desc = space[key]
                if key == "__dict__":  # the C-level descriptor, or a replacement that is never called
                    inner = _GETSET_GET(desc, v, t) if _type(desc) is _GETSET else None
                    state.append(["__dict__", self.of(inner, depth + 1) if _type(inner) is dict else ["unreadable"]])
                elif _type(desc) is _MEMBER and key not in ("__weakref__",):
                    try:
                        state.append([key, self.of(_MEMBER_GET(desc, v, t), depth + 1)])
                    except AttributeError:
                        state.append([key, ["unset"]])
        return ["o", name, state]


def snapshot(v: object) -> tuple[list, bool]:
    snap = _Snap()
    try:
        return snap.of(v), snap.plain
    except Exception as exc:  # noqa: BLE001 - an object the snapshot cannot read is simply not plain
        return ["!", _type(exc).__name__], False


def _digest(snap: list) -> str:
    return hashlib.sha256(json.dumps(snap, ensure_ascii=True).encode()).hexdigest()[:24]


def _record(kind: str, site: str, what: str, operands: list, result: object) -> None:
    if not _state["on"]:
        return
    snaps = [snapshot(x) for x in operands]
    rsnap, rplain = snapshot(result)
    plain = rplain and all(p for _, p in snaps)
    rec = [kind, site, what, [_digest(s) for s, _ in snaps], _digest(rsnap), int(plain)]
    size = _len(json.dumps(rec)) + 2  # and its separator in the line
    if _state["rest"] is None and _state["bytes"] + size <= MAX_LINE_BYTES:
        if plain:
            payload = json.dumps([[s for s, _ in snaps], rsnap])
            if _len(payload) <= MAX_PAYLOAD and _state["bytes"] + size + _len(payload) + 2 <= MAX_LINE_BYTES:
                rec.append(json.loads(payload))
                size += _len(payload) + 2
        _state["records"].append(rec)
        _state["bytes"] += size
        return
    rest = _state["rest"] or ["R", 0, 1, hashlib.sha256()]
    rest[1] += 1
    rest[2] &= int(plain)
    rest[3].update(json.dumps(rec[:6]).encode())
    _state["rest"] = rest


def begin() -> None:
    _state.update(on=True, records=[], rest=None, bytes=0)


def take() -> list:
    """The records of the test that just finished (and stop recording until the next begins)."""
    out, rest = _state["records"], _state["rest"]
    if rest is not None:
        out = [*out, ["R", rest[1], rest[2], rest[3].hexdigest()[:24]]]
    _state.update(on=False, records=[], rest=None)
    return out


def cmp(site: str, op: str, a: object, b: object) -> object:
    result = OPS[op](a, b)
    _record("K", site, op, [a, b], result)
    return result


def truth(site: str, x: object) -> bool:
    result = _bool(x)
    _record("B", site, "", [x], result)
    return result


def call(site: str, name: str, func, /, *args, **kwargs):  # type: ignore[no-untyped-def]
    result = func(*args, **kwargs)
    _record("A", site, name, [*args, *(kwargs[k] for k in sorted(kwargs))], result if name in WATCHED else None)
    if name.startswith(EXPECTS) and _type(result) is not _Expecting and _hasattr(_type(result), "__exit__"):
        return _Expecting(site, result)  # `with pytest.raises(E):` / `with self.assertRaises(E):`
    return result


EXPECTS = ("raises", "assertRaises", "warns", "assertWarns")
_hasattr = hasattr


class _Expecting:
    """A context manager of the harness (pytest.raises, unittest's assertRaises) whose exit also records the class
    of what was raised: a class of the graded code whose metaclass says any exception is a subclass of it earns
    nothing unless the original raised that very class there."""

    def __init__(self, site: str, inner: object) -> None:
        self._site, self._inner = site, inner

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self._inner.__enter__()  # type: ignore[attr-defined]

    def __exit__(self, kind, value, tb):  # type: ignore[no-untyped-def]
        _record("X", self._site, "raised", [kind], None)
        return self._inner.__exit__(kind, value, tb)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def _pytest_internal(node: ast.Compare) -> bool:
    """pytest's own `'name' in @py_builtins.locals()` of an assertion's failure explanation."""
    right = node.comparators[0]
    return isinstance(node.left, ast.Constant) and isinstance(right, ast.Call) \
        and isinstance(right.func, ast.Attribute) and isinstance(right.func.value, ast.Name) \
        and right.func.value.id.startswith("@py")


class _Instrument(ast.NodeTransformer):
    def __init__(self, rel: str, alias: str) -> None:
        self.rel, self.alias = rel, alias

    def _hook(self, name: str, node: ast.AST, args: list) -> ast.Call:
        """A call of this module's `name` at `node`'s place (only the nodes made here get locations: pytest's own
        may lack end positions, which the compiler accepts and fix_missing_locations would get wrong)."""
        where: dict[str, Any] = {a: getattr(node, a, None)
                                 for a in ("lineno", "col_offset", "end_lineno", "end_col_offset")}
        base = ast.Name(self.alias, ast.Load(), **where)
        func = ast.Attribute(base, name, ast.Load(), **where)
        site = ast.Constant(f"{self.rel}:{where['lineno']}:{where['col_offset']}", **where)
        made = [ast.Constant(a.value, **where) if isinstance(a, ast.Constant) and not hasattr(a, "lineno") else a
                for a in args]
        return ast.Call(func, [site, *made], [], **where)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if _len(node.ops) != 1 or _type(node.ops[0]).__name__ not in OPS or _pytest_internal(node):
            return node
        return self._hook("cmp", node, [ast.Constant(_type(node.ops[0]).__name__), node.left, node.comparators[0]])

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self._hook("truth", node.operand, [node.operand])
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name in WATCHED or name.startswith(WATCHED_PREFIXES):
            hooked = self._hook("call", node, [ast.Constant(name), f, *node.args])
            hooked.keywords = node.keywords
            return hooked
        return node


def instrument(mod: ast.Module, rel: str, module_name: str) -> None:
    """Route the checks of `mod` (already rewritten by pytest) through this module, imported as an alias no source
    can name; the import goes after the docstring and `from __future__` imports."""
    alias = "@agentrl_trace"
    _Instrument(rel, alias).visit(mod)
    pos = 0
    for pos, stmt in enumerate(mod.body):  # noqa: B007 - the first statement that is neither
        doc = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and pos == 0
        if not doc and not (isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"):
            break
    else:
        pos = _len(mod.body)
    where = {"lineno": 1, "col_offset": 0, "end_lineno": 1, "end_col_offset": 0}
    mod.body.insert(pos, ast.Import([ast.alias(module_name, alias, **where)], **where))
