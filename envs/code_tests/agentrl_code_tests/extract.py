"""The model's solution, extracted from the code it runs. Pure functions of source text (no sandbox, no I/O).

Rule (documented to the model in the prompt as "the last definition you run is your answer"): from every code block
that parses, keep the imports, the function and class definitions and module-level ALL_CAPS constant assignments;
drop every other top-level statement (prints, calls, tests, `if __name__ == "__main__":` blocks). The new block is
merged into the current solution: a definition replaces the earlier one of the same name (the last definition
wins), definitions the block does not mention are kept (helpers survive), imports are de-duplicated and hoisted.
Definitions keep their original source text (comments included) unless they share a line with another statement.
"""

from __future__ import annotations

import ast
import warnings

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_IMPORTS = (ast.Import, ast.ImportFrom)


def _parse(code: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _constant_names(node: ast.stmt) -> tuple[str, ...] | None:
    """Target names of `NAME = ...` / `NAME: T = ...` when every target is an ALL_CAPS name, else None."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets = [node.target]
    else:
        return None
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    if len(names) != len(targets) or not all(n.isupper() for n in names):
        return None
    return tuple(names)


def _key(node: ast.stmt) -> str | None:
    """What a kept statement defines ("def:f", "const:A,B", "import:<text>"); None for dropped statements."""
    if isinstance(node, _DEFS):
        return f"def:{node.name}"
    if isinstance(node, _IMPORTS):
        return f"import:{ast.unparse(node)}"
    names = _constant_names(node)
    return f"const:{','.join(names)}" if names else None


def _segments(code: str, module: ast.Module) -> list[tuple[str, str]]:
    """(key, source) of the kept top-level statements of `module`, in order."""
    lines = code.splitlines(keepends=True)
    spans = [(_start(n), n.end_lineno or n.lineno) for n in module.body]
    out: list[tuple[str, str]] = []
    for i, node in enumerate(module.body):
        key = _key(node)
        if key is None:
            continue
        lo, hi = spans[i]
        shared = any(a <= hi and lo <= b for j, (a, b) in enumerate(spans) if j != i)
        text = ast.unparse(node) if shared else "".join(lines[lo - 1 : hi]).rstrip()
        out.append((key, text))
    return out


def _start(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def definitions(code: str) -> list[tuple[str, str]] | None:
    """The kept (key, source) statements of `code`; None when it does not parse."""
    module = _parse(code)
    return None if module is None else _segments(code, module)


def merge_solution(current: str, code: str) -> str | None:
    """The solution after running `code` on top of `current`; None when `code` changes nothing (it does not
    parse, or keeps no statement)."""
    new = definitions(code)
    if not new:
        return None
    old = definitions(current) or []
    new_keys = {k for k, _ in new}
    merged = [(k, s) for k, s in old if k not in new_keys] + new
    imports = [s for k, s in merged if k.startswith("import:")]
    imports = sorted(dict.fromkeys(imports), key=lambda s: not s.startswith("from __future__"))
    body = [s for k, s in merged if not k.startswith("import:")]
    parts = ["\n".join(imports)] if imports else []
    result = "\n\n\n".join(parts + body) + "\n"
    return result if result != current else None


def defines(solution: str, name: str) -> bool:
    """True when `solution` defines a top-level function (or class) called `name`."""
    return any(k == f"def:{name}" for k, _ in definitions(solution) or [])
