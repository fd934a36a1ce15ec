"""rollouts.sandbox.jsonsafe: size and depth measured before the parser runs, one error type naming the
limit, never a RecursionError."""

import json

import pytest

from rollouts.sandbox.jsonsafe import JSONLimitError, check_depth, loads_bounded


@pytest.mark.parametrize(
    "text, depth",
    [
        ("1", 0),
        ('"[[[["', 0),  # brackets inside a string do not nest
        ("[]", 1),
        ('{"a": [1, {"b": 2}]}', 3),
        ('["]]]]\\\\", "[["]', 1),  # an escaped backslash before the closing quote
        ('["\\"[[["]', 1),  # an escaped quote inside the string
        ("[[], [[]], []]", 3),
        ("[[[]], [[[]]]]", 4),
    ],
)
def test_it_measures_the_nesting_depth_outside_strings(text, depth):
    for limit in range(6):
        if depth <= limit:
            check_depth(text, max_depth=limit)
        else:
            with pytest.raises(JSONLimitError):
                check_depth(text, max_depth=limit)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 50_000 + b"]" * 50_000,
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b"[" * 200_000,  # unbalanced: Python's parser would recurse before noticing the missing end
    ],
)
def test_it_refuses_deep_documents_naming_the_limit(body):
    with pytest.raises(JSONLimitError, match="nesting depth limit is 64") as exc:
        loads_bounded(body, max_depth=64)
    assert exc.value.limit == "max_depth" and exc.value.value == 64
    with pytest.raises(RecursionError):  # what the check spares its callers
        json.loads(body)


def test_it_finds_the_deep_part_after_a_long_shallow_one():
    body = "[" + "[]," * 100_000 + "[" * 65 + "]" * 65 + "]"
    with pytest.raises(JSONLimitError):
        loads_bounded(body, max_depth=65)
    assert loads_bounded(body, max_depth=66)


def test_it_refuses_oversized_bodies_before_decoding():
    with pytest.raises(JSONLimitError, match="size limit of 10 bytes") as exc:
        loads_bounded(b'"' + b"x" * 20 + b'"', max_depth=64, max_bytes=10)
    assert exc.value.limit == "max_bytes"
    # Measured in UTF-8 bytes for text as well: five characters of three bytes each.
    with pytest.raises(JSONLimitError):
        loads_bounded('"' + "€" * 5 + '"', max_depth=64, max_bytes=10)


def test_it_parses_what_is_within_the_limits():
    doc = {"a": [1, 2, {"b": "[[[{{{"}], "c": None, "d": "é"}
    text = json.dumps(doc)
    assert loads_bounded(text, max_depth=3) == doc
    assert loads_bounded(text.encode(), max_depth=3, max_bytes=len(text.encode())) == doc
    assert loads_bounded("[" * 64 + "]" * 64, max_depth=64) is not None


def test_its_other_errors_are_value_errors():
    with pytest.raises(UnicodeDecodeError):
        loads_bounded(b'"\xff"', max_depth=4)
    with pytest.raises(json.JSONDecodeError):
        loads_bounded("[1,", max_depth=4)
    with pytest.raises(json.JSONDecodeError):
        loads_bounded("[}", max_depth=4)  # mismatched, shallow: left to the parser, which refuses it
    with pytest.raises(ValueError, match="NaN"):
        loads_bounded("[NaN]", max_depth=4, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
