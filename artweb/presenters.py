"""Shaping rows for display: transcripts, config differences, code with error lines, diffs.

Pure functions of their inputs (no queries), shared by the training and rollouts pages (which is why
they live in artweb: rollouts never imports training).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from artweb.jsonlimits import json_loads_limited


def _text(content: Any) -> str:
    """Message content as text: a string, or OpenAI content parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(part.get("text") or f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return json.dumps(content, indent=2, ensure_ascii=False)


def _pretty_json(raw: Any) -> str:
    if isinstance(raw, str):
        try:
            return json.dumps(json_loads_limited(raw), indent=2, ensure_ascii=False)
        except (ValueError, TypeError):  # not JSON, or nested past the limit: shown as the text it is
            return raw
    return json.dumps(raw, indent=2, ensure_ascii=False)


def transcript(messages: list[dict] | None) -> list[dict]:
    """Chat messages → display turns: role, text, tool calls with pretty arguments, token counts."""
    turns = []
    for m in messages or []:
        if not isinstance(m, dict):
            turns.append({"role": "other", "text": str(m), "tool_calls": []})
            continue
        calls = []
        for c in m.get("tool_calls") or []:
            fn = c.get("function") or {}
            calls.append(
                {
                    "id": c.get("id", ""),
                    "name": fn.get("name") or c.get("name", "?"),
                    "arguments": _pretty_json(fn.get("arguments", c.get("arguments", ""))),
                }
            )
        token_ids = m.get("token_ids")
        logprobs = m.get("logprobs")
        mean_logprob = None
        if isinstance(logprobs, list) and logprobs and all(isinstance(v, (int, float)) for v in logprobs):
            mean_logprob = sum(logprobs) / len(logprobs)
        turns.append(
            {
                "role": m.get("role", "other"),
                "name": m.get("name", ""),
                "text": _text(m.get("content")),
                "tool_calls": calls,
                "tool_call_id": m.get("tool_call_id", ""),
                "tokens": len(token_ids) if isinstance(token_ids, list) else None,
                "mean_logprob": mean_logprob,
                "trained": isinstance(token_ids, list),
            }
        )
    return turns


def history_transcripts(histories) -> list[dict]:
    """A trajectory's additional histories (ART's: conversations beside its main one), each as display
    turns and the tools it offered, in order; anything that is not such a list shows nothing."""
    if not isinstance(histories, list):
        return []
    return [{"turns": transcript(h.get("messages")), "tools": h.get("tools")} for h in histories if isinstance(h, dict)]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def config_differences(configs: list[dict]) -> list[dict]:
    """Keys (flattened, "train.learning_rate") whose values are not all equal, with each config's value."""
    flat = [_flatten(c) for c in configs]
    keys = sorted(set().union(*flat)) if flat else []
    rows = []
    for key in keys:
        values = [f.get(key, "—") for f in flat]
        shown = [json.dumps(v) if not isinstance(v, str) else v for v in values]
        if len(set(shown)) > 1:
            rows.append({"key": key, "values": shown})
    return rows


_LINE = re.compile(r"\bline (\d+)\b")


def code_with_errors(code: str, errors: list[str], context: int = 3) -> list[dict]:
    """Numbered lines around each "line N: ..." error, the bad ones marked; [] when no line is named."""
    bad = {int(m.group(1)) for e in errors for m in [_LINE.search(str(e))] if m}
    if not bad or not code:
        return []
    lines = code.splitlines()
    keep = sorted({n for b in bad for n in range(b - context, b + context + 1) if 1 <= n <= len(lines)})
    out, last = [], None
    for n in keep:
        if last is not None and n != last + 1:
            out.append({"gap": True})
        out.append({"number": n, "text": lines[n - 1], "bad": n in bad})
        last = n
    return out


def code_diff_table(old: str, new: str, old_label: str, new_label: str) -> str:
    """An HTML side-by-side diff (difflib escapes the code itself)."""
    return difflib.HtmlDiff(tabsize=4, wrapcolumn=90).make_table(
        old.splitlines(), new.splitlines(), old_label, new_label, context=True, numlines=3
    )


# Keys a scenario's question is usually under, in the order looked for.
QUESTION_KEYS = ("prompt", "question", "input", "instruction", "task", "query", "problem")


def scenario_question(messages: list[dict] | None, scenario: dict | None) -> str:
    """The question a trajectory answered, from its scenario, when its transcript does not hold it (no user
    turn: scripts that record only the model's answer, as ART's seed examples do); "" when it does, or when
    the scenario has no question-like text field."""
    if any(isinstance(m, dict) and m.get("role") == "user" for m in messages or []):
        return ""
    for key in QUESTION_KEYS:
        value = (scenario or {}).get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""
