"""Scenarios are JSON objects; scripts read them as `scenario.prompt` or `scenario["prompt"]`."""

from __future__ import annotations

from typing import Any


class Scenario(dict):
    """A dict whose keys are also attributes, nested objects included.

    A key named like a dict method (items, keys, get …) is reached by item access only: libraries
    that receive the scenario as a dict rely on those methods.
    """

    def __init__(self, data: dict | None = None, **kwargs: Any) -> None:
        super().__init__({k: _wrap(v) for k, v in {**(data or {}), **kwargs}.items()})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"the scenario has no field {name!r} (it has: {', '.join(self) or 'none'})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = _wrap(value)


def _wrap(value: Any) -> Any:
    if isinstance(value, dict) and not isinstance(value, Scenario):
        return Scenario(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value
