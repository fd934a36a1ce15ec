"""Reads for uploads and scenario sets, scoped to what the user may see (the rule of artweb.visibility)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from artweb.errors import ApplicationError
from artweb.visibility import own, visible
from rollouts.models import (
    DataAttachment,
    RewardFunction,
    RewardFunctionVersion,
    RolloutScript,
    RolloutScriptVersion,
    Scenario,
    ScenarioSet,
)
from rollouts.sandbox.attachments import attachment_path
from rollouts.sandbox.bundles import ROLLOUT, BundleError, BundleLimits, bundle_read


def bundle_limits() -> BundleLimits:
    """The operator's limits on a bundle (settings ARTWEB_BUNDLE_MAX_MB, ARTWEB_BUNDLE_MAX_FILES)."""
    return BundleLimits(max_files=settings.ARTWEB_BUNDLE_MAX_FILES, max_bytes=settings.ARTWEB_BUNDLE_MAX_MB << 20)


def bundle_upload_bytes() -> int:
    """The largest bundle zip accepted: the bundle's own limit, within what a request may carry (artweb.asgi),
    less room for the form's other fields."""
    return min(settings.ARTWEB_BUNDLE_MAX_MB << 20, (settings.ARTWEB_MAX_REQUEST_MB - 1) << 20)


def bundle_dir() -> Path:
    """Where stored rollout bundles live: one <sha256>.zip each, written once, never changed."""
    return settings.DATA_DIR / "bundles"


def script_version_bundle(version: RolloutScriptVersion) -> Path | None:
    """The stored bundle a script version runs with (its files go beside rollout.py); None: a plain script."""
    return bundle_dir() / f"{version.bundle_sha256}.zip" if version.bundle_sha256 else None


def script_version_sources(version: RolloutScriptVersion) -> list[str]:
    """The Python sources a script version runs: its rollout.py and, for a bundle, every other .py file in
    it (what a text test for art.rewards must read). A stored bundle that cannot be read adds nothing here:
    the batch that unpacks it fails with the reason."""
    sources = [version.content]
    path = script_version_bundle(version)
    if path is not None:
        try:
            bundle = bundle_read(path.read_bytes(), bundle_limits())
        except (OSError, BundleError):
            return sources
        sources += [
            data.decode("utf-8", "replace")
            for name, data in bundle.files.items()
            if name.endswith(".py") and name != ROLLOUT
        ]
    return sources


@dataclass(frozen=True)
class BundleFile:
    """One file of a stored bundle as the script page lists it: its text when it is UTF-8 text of a size a
    page can show, else None (a wheel, a database, a large data file)."""

    name: str
    size: int
    text: str | None


BUNDLE_FILE_SHOWN_BYTES = 256 * 1024


def script_version_files(version: RolloutScriptVersion) -> tuple[list[BundleFile], str | None]:
    """The files a bundle version holds besides rollout.py, and the reason they cannot be listed (a stored
    bundle missing or changed on disk: the batch would refuse it too); ([], None) for a plain script."""
    path = script_version_bundle(version)
    if path is None:
        return [], None
    try:
        bundle = bundle_read(path.read_bytes(), bundle_limits())
    except OSError:
        return [], f"The stored bundle {path.name} cannot be read; upload the bundle again as a new version."
    except BundleError as exc:
        return [], f"The stored bundle is refused: {exc}"
    files = []
    for name, data in bundle.files.items():
        if name == ROLLOUT:
            continue
        text = None
        if len(data) <= BUNDLE_FILE_SHOWN_BYTES and not name.endswith(".whl"):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        files.append(BundleFile(name=name, size=len(data), text=text))
    return files, None


def _visible(model, user) -> QuerySet:
    return visible(model.objects.all(), user)


def script_list(*, user) -> QuerySet[RolloutScript]:
    return _visible(RolloutScript, user)


def script_get(*, user, script_id: int) -> RolloutScript:
    return get_object_or_404(_visible(RolloutScript, user), id=script_id)


def reward_list(*, user) -> QuerySet[RewardFunction]:
    return _visible(RewardFunction, user)


def reward_get(*, user, reward_id: int) -> RewardFunction:
    return get_object_or_404(_visible(RewardFunction, user), id=reward_id)


def scenario_set_list(*, user) -> QuerySet[ScenarioSet]:
    return _visible(ScenarioSet, user)


def scenario_set_get(*, user, scenario_set_id: int) -> ScenarioSet:
    return get_object_or_404(_visible(ScenarioSet, user), id=scenario_set_id)


def scenario_list(*, user) -> QuerySet[Scenario]:
    """Scenarios of the scenario sets the user may see."""
    return visible(Scenario.objects.select_related("scenario_set"), user, owner_field="scenario_set__owner")


def script_version_list(*, user) -> QuerySet[RolloutScriptVersion]:
    """Versions of the scripts the user may launch with (staff: all), newest first per script."""
    qs = RolloutScriptVersion.objects.select_related("asset").order_by("asset__name", "-number")
    return visible(qs, user, owner_field="asset__owner")


def reward_version_list(*, user) -> QuerySet[RewardFunctionVersion]:
    qs = RewardFunctionVersion.objects.select_related("asset").order_by("asset__name", "-number")
    return visible(qs, user, owner_field="asset__owner")


# --- data attachments --------------------------------------------------------------------------


def attachment_dir() -> Path:
    """Where stored attachments live: one file per content hash, written once, never changed."""
    return settings.DATA_DIR / "attachments"


def attachment_max_bytes() -> int:
    """The largest attachment accepted (ARTWEB_ATTACHMENT_MAX_MB)."""
    return settings.ARTWEB_ATTACHMENT_MAX_MB << 20


def attachment_list(*, user) -> QuerySet[DataAttachment]:
    return _visible(DataAttachment, user)


def attachment_get(*, user, attachment_id: int) -> DataAttachment:
    return get_object_or_404(_visible(DataAttachment, user), id=attachment_id)


def attachment_own_list(*, user) -> QuerySet[DataAttachment]:
    """The attachments the user's runs may name: their own, staff included (see attachments_resolve)."""
    return own(DataAttachment.objects.all(), user)


def attachment_file(attachment: DataAttachment) -> Path:
    return attachment_path(attachment_dir(), attachment.sha256)


def attachments_lookup(*, owner, names: list[str]) -> tuple[dict[str, Path], list[str]]:
    """name -> stored file of each of `owner`'s attachments among `names`, and the names that are none of
    theirs, in order. A run names its owner's own attachments only (staff included: a name means one of
    yours, artweb.visibility's `own`)."""
    found = {a.name: a for a in own(DataAttachment.objects.filter(name__in=names), owner)}
    files = {name: attachment_file(found[name]) for name in names if name in found}
    return files, [name for name in names if name not in found]


def attachments_resolve(*, owner, names: list[str]) -> dict[str, Path]:
    """name -> stored file of each of `owner`'s attachments a run names (attachments_lookup); a name with
    no such attachment is refused, naming it."""
    files, missing = attachments_lookup(owner=owner, names=names)
    if missing:
        raise ApplicationError(
            f"You have no data attachment named {missing[0]!r}. Upload it (Attachments page, the API or "
            "`artweb upload attachment`) or remove it from the run's attachments.",
            field_errors={"attachments": [f"{name}: no such attachment of yours" for name in missing]},
        )
    return files
