"""Product modules stay small enough to read: at most 500 lines each, no function over 80 lines.

A module that must be longer says why in a line of its own near the top, `# Longer than 500 lines: <why>`
(or, for one function, a comment `# Longer than 80 lines: <why>` on the line above its `def`). Migrations
are generated and exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("artweb", "training", "rollouts")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def product_modules(root: Path = ROOT):
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def oversized(path: Path) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    found = []
    head = "\n".join(lines[:40])
    if len(lines) > MAX_MODULE_LINES and "# Longer than 500 lines:" not in head:
        found.append(f"{len(lines)} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = lines[start - 2] if start >= 2 else ""
            if length > MAX_FUNCTION_LINES and "# Longer than 80 lines:" not in above:
                found.append(f"{node.name} (line {node.lineno}): {length} lines")
    return found


def test_no_product_module_or_function_is_longer_than_the_limit():
    found = [f"{path.relative_to(ROOT)} {item}" for path in product_modules() for item in oversized(path)]
    assert found == []


def test_the_check_finds_a_long_module_and_a_long_function(tmp_path):
    long_function = "def f():\n" + "    x = 1\n" * 90
    path = tmp_path / "long.py"
    path.write_text(long_function + "\n" * 420)
    assert oversized(path) == ["511 lines", "f (line 1): 91 lines"]
    path.write_text("# Longer than 500 lines: a table.\n" + "# Longer than 80 lines: one query.\n" + long_function)
    assert oversized(path) == []
