"""JSON parsed only after its size and nesting depth are known to be within limits.

Python's json parser recurses once per level of nesting: a document nested 50,000 deep raises
RecursionError (or exhausts the C stack) instead of a ValueError, and one that is merely large is
decoded into memory whole. `loads_bounded` measures both before the parser sees the text, so every
caller (the web API, uploads, the worker's record reader, the inference proxy) refuses a hostile body
with one error type whose message names the limit.

Pure: no Django, so the worker's sandbox and the web process share it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

# A JSON string: quote, runs of plain characters and escapes, quote. Outside strings valid JSON has no
# quote character, so scanning left to right these matches are exactly the document's strings.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_OPEN_SQUARE, _OPEN_CURLY = ord("["), ord("{")


class JSONLimitError(ValueError):
    """The document is over a size or nesting limit; the message names the limit and its value."""

    def __init__(self, message: str, *, limit: str, value: int) -> None:
        super().__init__(message)
        self.limit = limit  # "max_depth" or "max_bytes"
        self.value = value


def _depth_error(max_depth: int) -> JSONLimitError:
    return JSONLimitError(
        f"The JSON is nested more than {max_depth} levels deep (the nesting depth limit is {max_depth}). "
        "Flatten the document.",
        limit="max_depth",
        value=max_depth,
    )


def check_depth(text: str, *, max_depth: int) -> None:
    """Raise JSONLimitError when any array or object in `text` sits more than `max_depth` levels deep.

    Counts brackets outside strings, which bounds how deep the parser will recurse whether or not the
    text is valid JSON (a text that is not valid JSON is left for the parser to refuse). Linear in the
    size of the text, the heavy lifting done by regular expressions and numpy in C.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if brackets.count("[") + brackets.count("{") <= max_depth:
        return  # fewer openers than the limit: no nesting can be deeper
    # Depth after each bracket: +1 for an opener, -1 for a closer, never below 0 (a stray closer is the
    # parser's to refuse). The clamped walk is the running sum minus its running minimum (at most 0), so
    # numpy does it in a few passes at C speed: 8 MB of brackets in tens of milliseconds.
    steps = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    walk = np.cumsum(np.where((steps == _OPEN_SQUARE) | (steps == _OPEN_CURLY), 1, -1), dtype=np.int64)
    depth = walk - np.minimum.accumulate(np.minimum(walk, 0))
    if int(depth.max()) > max_depth:
        raise _depth_error(max_depth)


def loads_bounded(
    data: bytes | bytearray | str, *, max_depth: int, max_bytes: int | None = None, **json_kwargs: Any
) -> Any:
    """json.loads(data, **json_kwargs) after checking size (in bytes of UTF-8) and nesting depth.

    Raises JSONLimitError over a limit, UnicodeDecodeError for bytes that are not UTF-8, and
    json.JSONDecodeError for text that is not JSON: all ValueErrors, none of them RecursionError.
    """
    if isinstance(data, (bytes, bytearray)):
        size = len(data)
    else:
        size = len(data) if data.isascii() else len(data.encode("utf-8", "surrogatepass"))
    if max_bytes is not None and size > max_bytes:
        raise JSONLimitError(
            f"The JSON is {size} bytes, over the size limit of {max_bytes} bytes. Send less.",
            limit="max_bytes",
            value=max_bytes,
        )
    text = bytes(data).decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    check_depth(text, max_depth=max_depth)
    return json.loads(text, **json_kwargs)
