"""RULER judges: which model scores a run's groups, and the judge endpoints people store for it.

A run's `ruler_judge` is "" (its own base model, served by the worker), "model:<name>" (another
registered base model the worker serves beside it) or "endpoint:<name>" (one of the owner's judge
endpoints: an OpenAI-compatible server elsewhere, with a key stored write-only). Whichever it is, the
judge is reached from the sandbox only through the batch's proxy, which adds the key on the way out and
connects to an endpoint through the egress guard (rollouts.sandbox.egress): public addresses on ports 443
and 80, unless the operator allows more with ARTWEB_EGRESS_ALLOW / ARTWEB_EGRESS_PORTS.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction

from artweb.errors import ApplicationError
from rollouts.sandbox.egress import EgressRefused, egress_url_check
from rollouts.sandbox.proxy import Upstream
from training.exports.crypto import secret_decrypt, secret_encrypt
from training.models import JudgeEndpoint, PretrainedModel
from training.selectors import base_model_visible, judge_endpoint_list

BASE = ""
MODEL_PREFIX = "model:"
ENDPOINT_PREFIX = "endpoint:"


def _field_error(message: str, field: str = "ruler_judge") -> ApplicationError:
    return ApplicationError(message, field_errors={field: [message]})


def judge_choices(*, owner) -> list[str]:
    """Every ruler_judge value this person may use, for error messages and the launch form."""
    return [
        BASE,
        *(f"{MODEL_PREFIX}{m.name}" for m in base_model_visible(owner)),
        *(f"{ENDPOINT_PREFIX}{e.name}" for e in judge_endpoint_list(owner=owner)),
    ]


def judge_resolve(*, owner, value: str) -> PretrainedModel | JudgeEndpoint | None:
    """The judge a ruler_judge value names for this owner: None for the run's base model, a PretrainedModel,
    or a JudgeEndpoint. Raises ApplicationError naming the choices when it names nothing they may use."""
    value = (value or "").strip()
    if value == BASE:
        return None
    found = None
    if value.startswith(MODEL_PREFIX):
        found = base_model_visible(owner).filter(name=value.removeprefix(MODEL_PREFIX)).first()
    elif value.startswith(ENDPOINT_PREFIX):
        found = judge_endpoint_list(owner=owner).filter(name=value.removeprefix(ENDPOINT_PREFIX)).first()
    if found is None:
        choices = ", ".join(repr(c) for c in judge_choices(owner=owner))
        raise _field_error(
            f"ruler_judge {value!r} names no judge you can use; choose one of {choices} "
            "('' is the run's own base model)."
        )
    return found


# --- endpoints -----------------------------------------------------------------------------------------


def judge_url_check(base_url: str) -> str:
    """An http(s) URL the egress guard accepts now (see the module's docstring). Checked when the endpoint
    is saved and again before each use; the guard checks once more on every connection the worker makes,
    as a name can be pointed elsewhere at any time."""
    base_url = (base_url or "").strip()
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _field_error("Give the judge server's base URL, e.g. https://api.example.com/v1.", "base_url")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise _field_error(
            "The base URL may not carry a user, password, query or fragment; the key goes in the key field.", "base_url"
        )
    try:
        egress_url_check(base_url, settings.ARTWEB_EGRESS)
    except EgressRefused as exc:
        raise _field_error(f"The judge server cannot be used: {exc}", "base_url") from None
    return base_url


def judge_upstream(endpoint: JudgeEndpoint) -> Upstream:
    """Where the worker's proxy sends the endpoint's requests: its URL (checked again now), its key, and the
    egress policy every connection to it is checked under."""
    return Upstream(judge_url_check(endpoint.base_url), judge_endpoint_key(endpoint), egress=settings.ARTWEB_EGRESS)


def _check_fields(name: str, model: str) -> tuple[str, str]:
    name, model = (name or "").strip(), (model or "").strip()
    if not name or len(name) > 100 or any(c.isspace() for c in name):
        raise _field_error("Give the judge a name of 1 to 100 characters without spaces.", "name")
    if not model or len(model) > 200:
        raise _field_error("Give the judge model's name at that server (1 to 200 characters).", "model")
    return name, model


@transaction.atomic
def judge_endpoint_create(*, owner, name: str, base_url: str, model: str, api_key: str = "") -> JudgeEndpoint:
    name, model = _check_fields(name, model)
    endpoint = JudgeEndpoint(owner=owner, name=name, base_url=judge_url_check(base_url), model=model)
    _set_key(endpoint, api_key)
    try:
        with transaction.atomic():
            endpoint.save()
    except IntegrityError as exc:
        raise _field_error(f"You already have a judge named {name!r}; pick another name.", "name") from exc
    return endpoint


@transaction.atomic
def judge_endpoint_update(
    *, endpoint: JudgeEndpoint, base_url: str | None = None, model: str | None = None, api_key: str | None = None
) -> JudgeEndpoint:
    """Change what is given; the key is replaced only when a new one is given (empty string: no key)."""
    if base_url is not None:
        endpoint.base_url = judge_url_check(base_url)
    if model is not None:
        endpoint.model = _check_fields(endpoint.name, model)[1]
    if api_key is not None:
        _set_key(endpoint, api_key)
    endpoint.save()
    return endpoint


def judge_endpoint_delete(*, endpoint: JudgeEndpoint) -> None:
    endpoint.delete()


def _set_key(endpoint: JudgeEndpoint, api_key: str) -> None:
    api_key = (api_key or "").strip()
    endpoint.key_encrypted = secret_encrypt(api_key) if api_key else ""
    endpoint.key_last4 = api_key[-4:] if len(api_key) >= 12 else ""


def judge_endpoint_key(endpoint: JudgeEndpoint) -> str | None:
    """The stored key, for the worker's proxy only."""
    return secret_decrypt(endpoint.key_encrypted) if endpoint.key_encrypted else None
