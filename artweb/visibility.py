"""Who may see and who may change a row: the one rule that every app's selectors apply, and through
them every page, API view, WebSocket consumer, service check and the admin.

The rule, for every kind of row that has an owner:

- staff see every row and may change it. Staff are the operators: they answer for everything the
  deployment runs (the admin lets them cancel, retry and delete anyone's work), so no page or
  API may hide from them what the admin shows;
- anyone else sees their own rows and the shared ones (a row whose owner may be null and is: the base
  models everyone may train), and changes only their own. Shared rows are changed by staff;
- nobody signed in sees nothing.

Seeing a row is also what it takes to use it in one's own work: a run may train on any base model,
script, reward function or scenario set that its owner may see.

The staff policy is one for every kind of row: staff see everyone's runs, uploads, dry runs, re-scores,
playground sessions and answer diffs alike, never only their own, for the reason above.

What `own` is for is not who may see a row but whose names a lookup resolves. A person's judge
endpoints (`ruler_judge: "endpoint:<name>"`), export targets ("the targets of my runs"), checkpoint
aliases and the other names the OpenAI-compatible endpoint answers to (`model="my-agent"`,
`<run>@<step>`: run names are not unique across people) are looked up among that person's. The pages and API views that manage such settings list and look up the signed-in person's
own, staff included, because a staff member's list is what their own runs use (another person's
target there would be one their runs never read); staff see and change everyone's in the admin, and
the services let them (`may_change`).
"""

from __future__ import annotations

from django.db.models import Model, Q, QuerySet

from artweb.errors import ApplicationError


def sees_everything(user) -> bool:
    """Whether the user sees every row of every kind: staff do."""
    return bool(user is not None and user.is_authenticated and user.is_staff)


def _may_be_shared(model: type[Model], owner_field: str) -> bool:
    """Whether rows of model can be shared: the owner field at the end of the lookup path allows null."""
    field = None
    for name in owner_field.split("__"):
        field = model._meta.get_field(name)
        model = field.related_model
    return bool(field.null)


def _mine(queryset: QuerySet, user, owner_field: str) -> QuerySet:
    """The user's own rows of queryset and the shared ones."""
    condition = Q(**{owner_field: user})
    if _may_be_shared(queryset.model, owner_field):
        condition |= Q(**{f"{owner_field}__isnull": True})
    return queryset.filter(condition)


def visible(queryset: QuerySet, user, *, owner_field: str = "owner") -> QuerySet:
    """The rows of queryset the user may see. owner_field: the lookup path to the row's owner
    ("owner", "asset__owner", "run__owner")."""
    if user is None or not user.is_authenticated:
        return queryset.none()
    return queryset if sees_everything(user) else _mine(queryset, user, owner_field)


def own(queryset: QuerySet, user, *, owner_field: str = "owner") -> QuerySet:
    """The user's own rows and the shared ones, staff or not: the settings a person's own runs resolve
    by name (see the module's docstring)."""
    if user is None or not user.is_authenticated:
        return queryset.none()
    return _mine(queryset, user, owner_field)


def _owner_id(obj, owner_field: str):
    *path, last = owner_field.split("__")
    for name in path:
        obj = getattr(obj, name)
    return getattr(obj, f"{last}_id")


def may_see(user, obj, *, owner_field: str = "owner") -> bool:
    """Whether the user may see obj (and use it in their own work): staff, its owner, anyone if shared."""
    if user is None or not user.is_authenticated:
        return False
    owner_id = _owner_id(obj, owner_field)
    return sees_everything(user) or owner_id is None or owner_id == user.pk


def may_change(user, obj, *, owner_field: str = "owner") -> bool:
    """Whether the user may change obj: staff, or its owner (a shared row is changed by staff only)."""
    if user is None or not user.is_authenticated:
        return False
    return sees_everything(user) or _owner_id(obj, owner_field) == user.pk


def require_visible(user, obj, *, what: str, field: str, owner_field: str = "owner") -> None:
    """For a service that uses obj on the user's behalf: refuse it unless the user may see it. what: the
    thing as a person calls it (in the message); field: the input that named it."""
    if not may_see(user, obj, owner_field=owner_field):
        raise ApplicationError(f"That {what} is not yours.", field_errors={field: ["not found"]})


def visibility_context(request) -> dict:
    """Template context: whether the page's reader sees everyone's rows (lists then name each row's owner)."""
    return {"sees_everything": sees_everything(getattr(request, "user", None))}


class VisibleAdminMixin:
    """A ModelAdmin whose rows are those the signed-in staff member may see (owner_field as for visible)."""

    owner_field = "owner"

    def get_queryset(self, request):
        return visible(super().get_queryset(request), request.user, owner_field=self.owner_field)
