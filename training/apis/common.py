"""Inputs shared by the training APIs: things named by id or by name, resolved within what the user
may see (someone else's object reads as "not found", never as "not yours")."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from artweb.api import MAX_ID
from artweb.errors import ApplicationError
from rollouts import selectors as rollout_selectors
from training import selectors


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": MAX_ID},
            {"type": "string", "minLength": 1, "maxLength": 200},
        ]
    }
)
class IdOrNameField(serializers.Field):
    """An object's id (a JSON integer) or its name (a JSON string)."""

    default_error_messages = {"invalid": "Give an id (integer) or a name (string)."}

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, int):
            if not 1 <= data <= MAX_ID:
                self.fail("invalid")
            return data
        if isinstance(data, str) and 0 < len(data.strip()) <= 200 and "\x00" not in data:
            return data.strip()
        self.fail("invalid")

    def to_representation(self, value):
        return value


def _pick(qs, value, *, field: str, what: str):
    obj = qs.filter(**({"id": value} if isinstance(value, int) else {"name": value})).first()
    if obj is None:
        raise ApplicationError(
            f"No {what} {value!r} found among yours. Check the id or name "
            f"(list them with GET /api/v1/{field.replace('_', '-')}s/).",
            field_errors={field: ["not found"]},
        )
    return obj


def _version(asset, number: int | None, *, field: str, what: str):
    versions = asset.versions.select_related("asset")
    version = versions.filter(number=number).first() if number is not None else versions.order_by("-number").first()
    if version is None:
        raise ApplicationError(
            f"The {what} {asset.name!r} has no version {number}.", field_errors={field: ["not found"]}
        )
    return version


def resolve_base_model(user, value):
    return _pick(selectors.base_model_visible(user), value, field="base_model", what="base model")


def resolve_script_version(user, value, number: int | None):
    script = _pick(rollout_selectors.script_list(user=user), value, field="script", what="rollout script")
    return _version(script, number, field="script_version", what="rollout script")


def resolve_reward_version(user, value, number: int | None):
    if value is None:
        return None
    reward = _pick(rollout_selectors.reward_list(user=user), value, field="reward", what="reward function")
    return _version(reward, number, field="reward_version", what="reward function")


def resolve_scenario_set(user, value):
    if value is None:
        return None
    return _pick(rollout_selectors.scenario_set_list(user=user), value, field="scenario_set", what="scenario set")


class RefOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class VersionRefOutput(serializers.Serializer):
    id = serializers.IntegerField(source="asset_id")
    name = serializers.CharField(source="asset.name")
    version = serializers.IntegerField(source="number")
    version_id = serializers.IntegerField(source="id")
