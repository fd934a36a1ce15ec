"""How an uploaded scenario set is split into train and validation scenarios: a line's own "split" wins;
of the lines without one, the validation fraction is held out (an exact count, at least one from 5 such
lines on, none below 5), seeded by the file's content."""

import json
from pathlib import Path

import pytest

from rollouts.models import Scenario
from rollouts.services import scenario_set_create, scenarios_parse

EXAMPLES = Path(__file__).resolve().parents[2] / "rollouts" / "examples"


def _jsonl(n: int, **extra) -> str:
    return "\n".join(json.dumps({"prompt": f"question {i}", **extra}) for i in range(n)) + "\n"


def _splits(jsonl: str, fraction: float = 0.2) -> list[str]:
    return [split for split, _ in scenarios_parse(jsonl=jsonl, validation_fraction=fraction)]


@pytest.mark.parametrize(
    "lines, fraction, held_out",
    [
        (60, 0.2, 12),  # the documented default: a fifth, exactly
        (7, 0.2, 1),  # 1.4 rounds to 1
        (5, 0.2, 1),  # from 5 lines on, at least one
        (5, 0.1, 1),  # 0.5 would round to 0 or 1; the floor of one decides
        (4, 0.2, 0),  # below 5 lines: none
        (4, 0.5, 0),
        (10, 0.25, 3),  # 2.5 rounds half up
        (5, 0.99, 4),  # never all of them: one stays for training
        (60, 0.0, 0),  # a fraction of 0 holds none out
    ],
)
def test_it_holds_out_the_validation_fraction_of_the_lines_without_a_split(lines, fraction, held_out):
    splits = _splits(_jsonl(lines), fraction)
    assert (splits.count("validation"), splits.count("train")) == (held_out, lines - held_out)


def test_a_lines_own_split_wins_and_only_unmarked_lines_count():
    marked = [
        *(json.dumps({"prompt": f"t{i}", "split": "train"}) for i in range(20)),
        *(json.dumps({"prompt": f"v{i}", "split": "validation"}) for i in range(3)),
        *(json.dumps({"prompt": f"u{i}"}) for i in range(10)),
    ]
    pairs = scenarios_parse(jsonl="\n".join(marked), validation_fraction=0.2)
    by_prompt = {obj["prompt"]: split for split, obj in pairs}
    assert all(by_prompt[f"t{i}"] == "train" for i in range(20))
    assert all(by_prompt[f"v{i}"] == "validation" for i in range(3))
    assert sum(by_prompt[f"u{i}"] == "validation" for i in range(10)) == 2  # a fifth of the 10 unmarked


def test_the_same_file_gets_the_same_split_and_the_seed_is_its_content():
    text = _jsonl(40)
    first = _splits(text)
    assert _splits(text) == first and _splits(text.encode()) == first  # text or bytes: the same file
    # Another file's lines are picked with another seed: over a few files the held-out positions differ.
    others = {tuple(_splits(_jsonl(40, topic=t))) for t in ("a", "b", "c", "d")}
    assert len(others | {tuple(first)}) > 1


@pytest.mark.django_db
def test_uploading_a_file_twice_stores_the_same_split(alice):
    text = _jsonl(30)
    sets = [scenario_set_create(owner=alice, name=name, jsonl=text) for name in ("first", "again")]
    stored = [
        list(Scenario.objects.filter(scenario_set=s).order_by("index").values_list("split", flat=True)) for s in sets
    ]
    assert stored[0] == stored[1] and stored[0].count("validation") == 6
    assert [(s.train_count, s.validation_count) for s in sets] == [(24, 6), (24, 6)]


@pytest.mark.django_db
def test_the_example_set_is_split_as_its_lines_say(alice):
    """The shipped example marks every line, so the split rule cannot move its scenarios: the benchmarks'
    copy of the task (bench/task.py) reads the same 48 train and 12 validation scenarios from the file."""
    lines = [json.loads(line) for line in (EXAMPLES / "scenarios.jsonl").read_text().splitlines() if line.strip()]
    assert all(line.get("split") in ("train", "validation") for line in lines)
    example = scenario_set_create(owner=alice, name="example", jsonl=(EXAMPLES / "scenarios.jsonl").read_text())
    stored = list(Scenario.objects.filter(scenario_set=example).order_by("index").values_list("split", flat=True))
    assert stored == [line["split"] for line in lines]
    assert (example.train_count, example.validation_count) == (48, 12)
