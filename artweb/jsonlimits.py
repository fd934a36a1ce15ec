"""JSON from a person, parsed within the limits: every body, form field and uploaded line goes through
json_loads_limited, so none nests deeper than settings.ARTWEB_MAX_JSON_DEPTH (or reaches a
RecursionError) and none carries NaN or Infinity, which PostgreSQL's jsonb refuses.

The depth check itself is rollouts.sandbox.jsonsafe, pure, which the worker's record reader uses too.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from rollouts.sandbox.jsonsafe import JSONLimitError, loads_bounded

__all__ = ["JSONLimitError", "json_loads_limited"]


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def json_loads_limited(raw: bytes | str, *, max_bytes: int | None = None) -> Any:
    """json.loads, strict, after the size (max_bytes, if given) and depth checks. Raises ValueError:
    JSONLimitError (its message names the limit) over a limit, UnicodeDecodeError for bytes that are not
    UTF-8, json.JSONDecodeError for text that is not JSON; never RecursionError."""
    return loads_bounded(
        raw, max_depth=settings.ARTWEB_MAX_JSON_DEPTH, max_bytes=max_bytes, parse_constant=_reject_constant
    )
