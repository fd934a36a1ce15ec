"""Writes for rollout scripts, reward functions and scenario sets.

Uploads are validated before anything is saved; a version's content never changes once written, and
uploading the same content twice returns the existing version.
"""

from __future__ import annotations

import hashlib
import json
import random

from django.db import IntegrityError, transaction

from artweb.errors import ApplicationError
from artweb.jsonlimits import json_loads_limited
from rollouts.models import (
    RewardFunction,
    RewardFunctionVersion,
    RolloutScript,
    RolloutScriptVersion,
    Scenario,
    ScenarioSet,
)
from rollouts.sandbox.bundles import Bundle, BundleError, bundle_read, bundle_store
from rollouts.sandbox.validation import validate_reward, validate_script
from rollouts.selectors import bundle_dir, bundle_limits

MAX_SCENARIO_BYTES = 20 * 1024 * 1024
MAX_SCENARIOS = 200_000


def _decode(content: str | bytes, *, what: str) -> str:
    if isinstance(content, bytes):
        try:
            return content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApplicationError(
                f"The {what} is not UTF-8 text (byte {exc.start} is invalid). Save the file as UTF-8 and upload it again.",
                field_errors={"content": ["not UTF-8"]},
            ) from exc
    return content


def _issues_error(what: str, issues: list[dict]) -> ApplicationError:
    lines = [f"line {i['line']}: {i['message']}" if i.get("line") else i["message"] for i in issues]
    return ApplicationError(f"The {what} did not validate: " + "; ".join(lines), field_errors={"content": lines})


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise ApplicationError(
            "Give a name of 1 to 200 characters.", field_errors={"name": ["required, at most 200 characters"]}
        )
    return name


# --- rollout scripts ---------------------------------------------------------------------------


def script_validate(*, content: str | bytes) -> str:
    text = _decode(content, what="rollout script")
    issues = validate_script(text)
    if issues:
        raise _issues_error("rollout script", issues)
    return text


def bundle_validate(*, data: bytes) -> tuple[Bundle, str]:
    """The checked bundle of a zip upload and its rollout.py text, validated like a script."""
    try:
        bundle = bundle_read(data, bundle_limits())
    except BundleError as exc:
        raise ApplicationError(str(exc), field_errors={"file": [str(exc)]}) from exc
    try:
        text = script_validate(content=bundle.rollout_bytes)
    except ApplicationError as exc:
        raise ApplicationError(f"rollout.py in the bundle: {exc.message}", field_errors=exc.field_errors) from exc
    return bundle, text


def _script_payload(content: str | bytes | None, bundle: bytes | None) -> tuple[dict, Bundle | None]:
    """The version's fields from either a script's source or a bundle's zip, and the checked bundle (None for
    a script), which _bundle_keep stores once nothing else can refuse the upload."""
    if (content is None) == (bundle is None):
        raise ApplicationError(
            "Upload a rollout script (.py) or a bundle (.zip), one of the two.", field_errors={"file": ["required"]}
        )
    if bundle is None:
        text = script_validate(content=content)
        return {"content": text, "sha256": _sha(text)}, None
    checked, text = bundle_validate(data=bundle)
    return {"content": text, "sha256": checked.sha256, "bundle_sha256": checked.sha256}, checked


def _bundle_keep(bundle: Bundle | None) -> None:
    """Store the bundle by its hash (again when a version already names it: the file is the same). Written
    inside the version's transaction: one that then fails leaves a file nothing names, reused by a later
    upload of the same files."""
    if bundle is not None:
        bundle_store(bundle, bundle_dir())


@transaction.atomic
def script_create(
    *,
    owner,
    name: str,
    content: str | bytes | None = None,
    bundle: bytes | None = None,
    description: str = "",
    companion_reward: RewardFunction | None = None,
) -> RolloutScriptVersion:
    """A new script and its version 1, from `content` (the source) or `bundle` (a zip's bytes)."""
    name = _check_name(name)
    _check_companion(owner, companion_reward)
    payload, checked = _script_payload(content, bundle)
    if RolloutScript.objects.filter(owner=owner, name=name).exists():
        raise ApplicationError(
            f"You already have a rollout script named {name!r}: upload a new version of it, or pick another name.",
            field_errors={"name": ["already exists"]},
        )
    script = RolloutScript.objects.create(
        owner=owner, name=name, description=description, companion_reward=companion_reward
    )
    _bundle_keep(checked)
    return RolloutScriptVersion.objects.create(asset=script, number=1, **payload)


@transaction.atomic
def script_version_create(
    *, script: RolloutScript, content: str | bytes | None = None, bundle: bytes | None = None, note: str = ""
) -> RolloutScriptVersion:
    payload, checked = _script_payload(content, bundle)
    text, sha = payload.pop("content"), payload.pop("sha256")
    _bundle_keep(checked)
    return _version_create(RolloutScriptVersion, asset=script, text=text, note=note, sha=sha, **payload)


def _check_companion(owner, reward: RewardFunction | None) -> None:
    if reward is not None and reward.owner_id != owner.id:
        raise ApplicationError(
            "The companion reward function must be one of yours.", field_errors={"companion_reward": ["not found"]}
        )


def script_companion_set(*, script: RolloutScript, reward: RewardFunction | None) -> RolloutScript:
    """Name the reward function written for this script (None: none); the launch form preselects its
    newest version whenever the script is picked."""
    _check_companion(script.owner, reward)
    script.companion_reward = reward
    script.save(update_fields=["companion_reward", "updated_at"])
    return script


# --- reward functions --------------------------------------------------------------------------


def reward_validate(*, content: str | bytes) -> tuple[str, str]:
    """Return (text, kind) where kind is "trajectory" or "group"."""
    text = _decode(content, what="reward function")
    kind, issues = validate_reward(text)
    if issues:
        raise _issues_error("reward function", issues)
    return text, kind


@transaction.atomic
def reward_create(*, owner, name: str, content: str | bytes, description: str = "") -> RewardFunctionVersion:
    name = _check_name(name)
    text, kind = reward_validate(content=content)
    if RewardFunction.objects.filter(owner=owner, name=name).exists():
        raise ApplicationError(
            f"You already have a reward function named {name!r}: upload a new version of it, or pick another name.",
            field_errors={"name": ["already exists"]},
        )
    reward = RewardFunction.objects.create(owner=owner, name=name, description=description)
    return RewardFunctionVersion.objects.create(asset=reward, number=1, content=text, sha256=_sha(text), kind=kind)


@transaction.atomic
def reward_version_create(*, reward: RewardFunction, content: str | bytes, note: str = "") -> RewardFunctionVersion:
    text, kind = reward_validate(content=content)
    return _version_create(RewardFunctionVersion, asset=reward, text=text, note=note, kind=kind)


def _version_create(model, *, asset, text: str, note: str, sha: str | None = None, **extra):
    sha = sha or _sha(text)
    existing = model.objects.filter(asset=asset, sha256=sha).first()
    if existing:
        return existing
    # Lock the asset row so two uploads at once cannot take the same version number.
    type(asset).objects.select_for_update().get(pk=asset.pk)
    last = model.objects.filter(asset=asset).order_by("-number").values_list("number", flat=True).first() or 0
    version = model.objects.create(asset=asset, number=last + 1, content=text, sha256=sha, note=note, **extra)
    asset.save(update_fields=["updated_at"])
    return version


# --- scenario sets -----------------------------------------------------------------------------


MIN_LINES_TO_HOLD_OUT = 5


def held_out_count(unmarked: int, validation_fraction: float) -> int:
    """How many of a file's lines without a "split" key are held out for validation.

    validation_fraction of them, rounded half up; at least one from MIN_LINES_TO_HOLD_OUT lines on (a
    validation reward needs a scenario), none below it (a few lines are all needed for training), and
    never all of them, so they leave at least one training scenario.
    """
    if unmarked < MIN_LINES_TO_HOLD_OUT or validation_fraction <= 0:
        return 0
    return min(max(1, int(unmarked * validation_fraction + 0.5)), unmarked - 1)


def scenarios_parse(*, jsonl: str | bytes, validation_fraction: float) -> list[tuple[str, dict]]:
    """Parse a JSONL upload into (split, scenario) pairs.

    A line's own "split" key ("train"/"validation") wins; of the lines without one, validation_fraction
    are held out (see held_out_count), picked at random with the file's content as the seed, so the same
    file always gets the same split.
    """
    raw = jsonl if isinstance(jsonl, bytes) else jsonl.encode("utf-8")
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ApplicationError(
            f"The scenario file is {len(raw)} bytes; the limit is {MAX_SCENARIO_BYTES}.",
            field_errors={"file": ["too large"]},
        )
    if not 0.0 <= validation_fraction < 1.0:
        raise ApplicationError(
            "validation_fraction must be at least 0 and below 1.",
            field_errors={"validation_fraction": ["must be in [0, 1)"]},
        )
    text = _decode(raw, what="scenario file")
    rows: list[tuple[str | None, dict]] = []
    errors: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json_loads_limited(line)
        except json.JSONDecodeError as exc:
            errors.append(f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        except ValueError as exc:  # over the depth limit, or NaN/Infinity
            errors.append(f"line {number}: {exc}")
            continue
        if not isinstance(obj, dict):
            errors.append(f"line {number}: each line must be a JSON object, got {type(obj).__name__}")
            continue
        split = obj.get("split")
        if split not in (None, "train", "validation"):
            errors.append(f'line {number}: split must be "train" or "validation", got {split!r}')
            continue
        rows.append((split, obj))
        if len(errors) >= 20:
            break
    if errors:
        raise ApplicationError(
            "The scenario file has errors: " + "; ".join(errors[:20]), field_errors={"file": errors[:20]}
        )
    if not rows:
        raise ApplicationError(
            "The scenario file has no scenarios: give one JSON object per line.", field_errors={"file": ["empty"]}
        )
    if len(rows) > MAX_SCENARIOS:
        raise ApplicationError(
            f"The scenario file has {len(rows)} scenarios; the limit is {MAX_SCENARIOS}.",
            field_errors={"file": ["too many scenarios"]},
        )
    unmarked = [i for i, (split, _) in enumerate(rows) if split is None]
    # An exact count, not a coin flip per line: 60 lines at 0.2 hold out 12, not anything from 4 to 20.
    rng = random.Random(hashlib.sha256(raw).hexdigest())
    held_out = set(rng.sample(unmarked, held_out_count(len(unmarked), validation_fraction)))
    out = [(split or ("validation" if i in held_out else "train"), obj) for i, (split, obj) in enumerate(rows)]
    if not any(s == "train" for s, _ in out):
        raise ApplicationError(
            'The scenario file has no training scenarios: mark some lines "split": "train".',
            field_errors={"file": ["no training scenarios"]},
        )
    return out


@transaction.atomic
def scenario_set_create(
    *, owner, name: str, jsonl: str | bytes, validation_fraction: float = 0.2, description: str = ""
) -> ScenarioSet:
    name = _check_name(name)
    pairs = scenarios_parse(jsonl=jsonl, validation_fraction=validation_fraction)
    raw = jsonl if isinstance(jsonl, bytes) else jsonl.encode("utf-8")
    try:
        with transaction.atomic():
            scenario_set = ScenarioSet.objects.create(
                owner=owner,
                name=name,
                description=description,
                sha256=hashlib.sha256(raw).hexdigest(),
                train_count=sum(1 for s, _ in pairs if s == "train"),
                validation_count=sum(1 for s, _ in pairs if s == "validation"),
            )
    except IntegrityError as exc:
        raise ApplicationError(
            f"You already have a scenario set named {name!r}; pick another name.",
            field_errors={"name": ["already exists"]},
        ) from exc
    Scenario.objects.bulk_create(
        [Scenario(scenario_set=scenario_set, index=i, split=s, data=obj) for i, (s, obj) in enumerate(pairs)],
        batch_size=2000,
    )
    return scenario_set
