"""Procedural bug synthesis by source slicing: every mutation replaces only the byte span of the node it changes,
so untouched code (comments, spacing, quoting) is byte-for-byte the original. Pure: no I/O.

`candidates(source)` lists every applicable mutation of one file in a deterministic order; `apply(source, m)`
returns the mutated text. The kinds (SWE-smith's procedural modifiers):

    invert_if            `if c:` -> `if not (c):`
    change_operator      a binary / comparison / boolean operator -> a plausible other one (+ -> -, < -> <=, and -> or)
    swap_operands        `a - b` -> `b - a` (non-commutative operators)
    change_constant      an int n -> n + 1 (or n - 1), True <-> False
    remove_assignment    drop one assignment statement (`pass` if it was alone in its block)
    remove_condition     `if c: body` (no else) -> body, dedented
    remove_loop          drop one for / while loop
    shuffle_statements   swap two adjacent one-line statements
    break_chain          `x.f().g()` -> `x.g()` (drop one link of a call chain)
    remove_wrapper       `f(x)` -> `x` (a one-argument call of a plain name)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

KINDS = ("invert_if", "change_operator", "swap_operands", "change_constant", "remove_assignment",
         "remove_condition", "remove_loop", "shuffle_statements", "break_chain", "remove_wrapper")

_BINOP_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.FloorDiv: ("//", "*"),
               ast.Div: ("/", "*"), ast.Mod: ("%", "//"), ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&"),
               ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<")}
_CMP_SWAP = {ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"),
             ast.Gt: (">", ">="), ast.GtE: (">=", ">"), ast.Is: ("is not", "is"), ast.IsNot: ("is not", "is"),
             ast.In: ("not in", "in"), ast.NotIn: ("not in", "in")}
_BOOL_SWAP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.LShift, ast.RShift)
_WRAPPERS_SKIP = {"print", "super", "isinstance", "getattr", "hasattr", "setattr", "type", "id", "iter", "next"}


@dataclass(frozen=True)
class Edit:
    """Replace source bytes [start, end) by `text`."""

    start: int
    end: int
    text: bytes


@dataclass(frozen=True)
class Mutation:
    kind: str
    line: int  # 1-based line of the mutated node (for the task's metadata)
    edits: tuple[Edit, ...]

    def describe(self) -> str:
        return f"{self.kind}@{self.line}"


class _Offsets:
    """(line, utf-8 column) -> byte offset into the file."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.starts = [0]
        for i, b in enumerate(data):
            if b == 0x0A:
                self.starts.append(i + 1)

    def at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.at(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.at(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def text(self, node: ast.AST) -> bytes:
        s, e = self.span(node)
        return self.data[s:e]

    def line_span(self, first: int, last: int) -> tuple[int, int]:
        """Bytes of whole lines first..last (1-based, inclusive), newline included."""
        end = self.starts[last] if last < len(self.starts) else len(self.data)
        return self.starts[first - 1], end

    def indent(self, line: int) -> bytes:
        s, e = self.line_span(line, line)
        raw = self.data[s:e]
        return raw[: len(raw) - len(raw.lstrip(b" \t"))]


def apply(source: bytes, mutation: Mutation) -> bytes:
    out = source
    for edit in sorted(mutation.edits, key=lambda e: e.start, reverse=True):
        out = out[: edit.start] + edit.text + out[edit.end:]
    return out


def candidates(source: bytes) -> list[Mutation]:
    """Every mutation of `source` that still parses, in a deterministic order (walk order, then kind)."""
    tree = ast.parse(source)
    off = _Offsets(source)
    docstrings = _docstring_nodes(tree)
    found: list[Mutation] = []
    for node in ast.walk(tree):
        for make in _MAKERS:
            m = make(node, off, docstrings)
            if m is not None and _parses(apply(source, m)) and apply(source, m) != source:
                found.append(m)
    return found


def _parses(data: bytes) -> bool:
    try:
        ast.parse(data)
    except (SyntaxError, ValueError):
        return False
    return True


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            out.add(id(body[0].value))
    return out


def _one(kind: str, node: ast.AST, start: int, end: int, text: bytes) -> Mutation:
    return Mutation(kind, node.lineno, (Edit(start, end, text),))  # type: ignore[attr-defined]


def _invert_if(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    if not isinstance(node, ast.If):
        return None
    s, e = off.span(node.test)
    return _one("invert_if", node, s, e, b"not (" + off.data[s:e] + b")")


def _gap_op(off: _Offsets, left: ast.AST, right: ast.AST, old: str, new: str) -> tuple[int, int, bytes] | None:
    """The operator token `old` between two operands -> an edit to `new` (only when found exactly once)."""
    gs, ge = off.span(left)[1], off.span(right)[0]
    gap = off.data[gs:ge]
    token = old.encode()
    if b"#" in gap or gap.count(token) != 1:
        return None
    i = gap.index(token)
    return gs + i, gs + i + len(token), new.encode()


def _change_operator(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    pair: tuple[str, str] | None = None
    left: ast.AST | None = None
    right: ast.AST | None = None
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        pair, left, right = _BINOP_SWAP[type(node.op)], node.left, node.right
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
        pair, left, right = _CMP_SWAP[type(node.ops[0])], node.left, node.comparators[0]
        if type(node.ops[0]) in (ast.Is, ast.In):
            pair = (pair[1], pair[0])  # "is" -> "is not": the old token is the short one
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        pair, left, right = _BOOL_SWAP[type(node.op)], node.values[0], node.values[1]
    if pair is None or left is None or right is None:
        return None
    edit = _gap_op(off, left, right, *pair)
    if edit is None:
        return None
    return _one("change_operator", node, *edit)


def _swap_operands(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, _NON_COMMUTATIVE)):
        return None
    if not all(isinstance(x, (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript))
               for x in (node.left, node.right)):
        return None
    ls, le = off.span(node.left)
    rs, re_ = off.span(node.right)
    return Mutation("swap_operands", node.lineno, (Edit(ls, le, off.data[rs:re_]), Edit(rs, re_, off.data[ls:le])))


def _change_constant(node: ast.AST, off: _Offsets, docstrings: set[int]) -> Mutation | None:
    if not isinstance(node, ast.Constant) or id(node) in docstrings:
        return None
    s, e = off.span(node)
    if isinstance(node.value, bool):
        return _one("change_constant", node, s, e, b"False" if node.value else b"True")
    if isinstance(node.value, int) and off.data[s:e].isdigit():
        new = node.value - 1 if node.value > 1 else node.value + 1
        return _one("change_constant", node, s, e, str(new).encode())
    return None


def _blocks(node: ast.AST) -> list[list[ast.stmt]]:
    return [b for b in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")) if isinstance(b, list) and b]


def _remove_stmt(kind: str, stmt: ast.stmt, block: list[ast.stmt], off: _Offsets) -> Mutation | None:
    if _shares_lines(stmt, block):
        return None
    s, e = off.line_span(stmt.lineno, stmt.end_lineno or stmt.lineno)
    text = b"" if len(block) > 1 else off.indent(stmt.lineno) + b"pass\n"
    return Mutation(kind, stmt.lineno, (Edit(s, e, text),))


def _shares_lines(stmt: ast.stmt, block: list[ast.stmt]) -> bool:
    """True when another statement of the block sits on one of stmt's lines (`a = 1; b = 2`)."""
    lines = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
    return any(o is not stmt and (o.lineno in lines or (o.end_lineno or o.lineno) in lines) for o in block)


def _remove_assignment(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    return _first_in_blocks(node, off, "remove_assignment", (ast.Assign, ast.AugAssign, ast.AnnAssign))


def _remove_loop(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    return _first_in_blocks(node, off, "remove_loop", (ast.For, ast.While))


def _first_in_blocks(node: ast.AST, off: _Offsets, kind: str, types: tuple[type, ...]) -> Mutation | None:
    """One mutation per (block owner, kind): the last statement of that type in the owner's blocks (varies by file,
    keeps the candidate list proportional to the code)."""
    if isinstance(node, (ast.Module, ast.ClassDef)):
        return None  # module/class level removals mostly break imports: never a useful bug
    for block in _blocks(node):
        for stmt in reversed(block):
            if isinstance(stmt, types):
                return _remove_stmt(kind, stmt, block, off)
    return None


def _remove_condition(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    if not isinstance(node, ast.If) or node.orelse or node.body[0].lineno == node.lineno:
        return None
    outer, inner = off.indent(node.lineno), off.indent(node.body[0].lineno)
    if not inner.startswith(outer) or len(inner) <= len(outer):
        return None
    s, e = off.line_span(node.lineno, node.end_lineno or node.lineno)
    body_s, _ = off.line_span(node.body[0].lineno, node.body[0].lineno)
    cut = len(inner) - len(outer)
    lines = off.data[body_s:e].splitlines(keepends=True)
    new = b"".join(ln[cut:] if ln[:cut].strip() == b"" else ln for ln in lines)
    return _one("remove_condition", node, s, e, new)


def _shuffle_statements(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    for block in _blocks(node):
        for a, b in zip(block, block[1:]):
            one_line = all(x.lineno == x.end_lineno for x in (a, b)) and b.lineno == a.lineno + 1
            if one_line and not isinstance(a, (ast.Return, ast.Raise)) and not isinstance(b, ast.Import):
                sa, ea = off.line_span(a.lineno, a.lineno)
                sb, eb = off.line_span(b.lineno, b.lineno)
                la, lb = off.data[sa:ea], off.data[sb:eb]
                if la.strip() == lb.strip() or not la.endswith(b"\n") or not lb.endswith(b"\n"):
                    continue
                return Mutation("shuffle_statements", a.lineno, (Edit(sa, eb, lb + la),))
    return None


def _break_chain(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)):
        return None
    s, e = off.span(node.value)
    return _one("break_chain", node, s, e, off.text(node.value.func.value))


def _remove_wrapper(node: ast.AST, off: _Offsets, _d: set[int]) -> Mutation | None:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1
            and not node.keywords and not isinstance(node.args[0], ast.Starred)
            and node.func.id not in _WRAPPERS_SKIP and node.func.id[:1].islower()):
        return None
    s, e = off.span(node)
    arg = off.text(node.args[0])
    return _one("remove_wrapper", node, s, e, b"(" + arg + b")" if b"\n" in arg else arg)


_MAKERS = (_invert_if, _change_operator, _swap_operands, _change_constant, _remove_assignment, _remove_condition,
           _remove_loop, _shuffle_statements, _break_chain, _remove_wrapper)
