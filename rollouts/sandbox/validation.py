"""Checks on an uploaded rollout script or reward function, before anything runs.

Static only (the source is parsed, never executed): UTF-8, a size limit, valid Python, and the entry
point defined at the top level with a signature artweb can call. Each issue is `{"line", "message"}`
with line None when it concerns the whole file; an empty list means the upload is accepted.
"""

from __future__ import annotations

import ast

MAX_SOURCE_BYTES = 256 * 1024

REWARD_ENTRY_POINTS = {"reward": "trajectory", "score_group": "group"}


def _issue(line: int | None, message: str) -> dict:
    return {"line": line, "message": message}


def _parse(source: str | bytes, what: str) -> tuple[ast.Module | None, list[dict]]:
    if isinstance(source, bytes):
        if len(source) > MAX_SOURCE_BYTES:
            return None, [
                _issue(None, f"The {what} is {len(source) // 1024} KB; the limit is {MAX_SOURCE_BYTES // 1024} KB.")
            ]
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = source[: exc.start].count(b"\n") + 1
            return None, [_issue(line, f"The {what} is not UTF-8 text (byte {exc.start}): save it as UTF-8.")]
    size = len(source.encode("utf-8", errors="surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        return None, [_issue(None, f"The {what} is {size // 1024} KB; the limit is {MAX_SOURCE_BYTES // 1024} KB.")]
    if "\x00" in source:
        line = source[: source.index("\x00")].count("\n") + 1
        return None, [_issue(line, f"The {what} contains a NUL character: is it a text file?")]
    if not source.strip():
        return None, [_issue(None, f"The {what} is empty.")]
    try:
        return ast.parse(source, filename=what), []
    except SyntaxError as exc:
        detail = f" (column {exc.offset})" if exc.offset else ""
        return None, [_issue(exc.lineno, f"Syntax error: {exc.msg}{detail}.")]


def _top_level_functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _accepts(fn: ast.FunctionDef | ast.AsyncFunctionDef, count: int) -> bool:
    """True when fn can be called with `count` positional arguments."""
    positional = fn.args.posonlyargs + fn.args.args
    required = len(positional) - len(fn.args.defaults)
    kw_required = [a for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=False) if d is None]
    if kw_required:
        return False
    return required <= count and (count <= len(positional) or fn.args.vararg is not None)


def validate_script(source: str | bytes) -> list[dict]:
    """Issues with a rollout script; it must define `async def rollout(model, scenario)`."""
    tree, issues = _parse(source, "rollout script")
    if tree is None:
        return issues
    fn = _top_level_functions(tree).get("rollout")
    if fn is None:
        return [
            _issue(
                None,
                "Define `async def rollout(model, scenario)` at the top level of the script: "
                "artweb calls it once per rollout and expects an art.Trajectory back.",
            )
        ]
    if not isinstance(fn, ast.AsyncFunctionDef):
        issues.append(
            _issue(
                fn.lineno,
                "`rollout` must be async: write `async def rollout(model, scenario)` and await the client's calls.",
            )
        )
    if not _accepts(fn, 2):
        issues.append(_issue(fn.lineno, "`rollout` must take two arguments, (model, scenario)."))
    return issues


def validate_reward(source: str | bytes) -> tuple[str | None, list[dict]]:
    """(kind, issues) for a reward function file; kind is "trajectory" or "group" when recognised.

    Either `reward(trajectory, scenario) -> float | None` or `score_group(group, scenario) ->
    list[float | None]`, sync or async.
    """
    tree, issues = _parse(source, "reward function")
    if tree is None:
        return None, issues
    found = {name: fn for name, fn in _top_level_functions(tree).items() if name in REWARD_ENTRY_POINTS}
    if not found:
        return None, [
            _issue(
                None,
                "Define `def reward(trajectory, scenario) -> float` (one trajectory at a time) "
                "or `def score_group(group, scenario) -> list[float]` (a whole group) at the "
                "top level.",
            )
        ]
    if len(found) > 1:
        line = max(fn.lineno for fn in found.values())
        return None, [
            _issue(line, "Define either `reward` or `score_group`, not both: artweb would not know which one to call.")
        ]
    name, fn = next(iter(found.items()))
    if not _accepts(fn, 2):
        first = "trajectory" if name == "reward" else "group"
        issues.append(_issue(fn.lineno, f"`{name}` must take two arguments, ({first}, scenario)."))
    return REWARD_ENTRY_POINTS[name], issues


def reward_kind(source: str) -> str:
    """The kind of an already validated reward function."""
    kind, issues = validate_reward(source)
    if issues or kind is None:
        raise ValueError("; ".join(i["message"] for i in issues) or "not a reward function")
    return kind


def script_sets_reward(source: str) -> bool:
    """Whether a rollout script gives its trajectories a reward itself: an assignment to some `.reward`,
    or a `reward=` keyword (as in `art.Trajectory(..., reward=...)`). A static reading, so it errs on
    the side of yes: any such line counts, reached or not."""
    tree, _ = _parse(source, "rollout script")
    if tree is None:
        return True  # a script that does not parse fails on its own, with its own message
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else ([node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
        )
        if any(isinstance(t, ast.Attribute) and t.attr == "reward" for t in targets):
            return True
        if isinstance(node, ast.Call) and any(k.arg == "reward" for k in node.keywords):
            return True
    return False
