"""What a run's tools may use: named hosts its agent reaches, and secrets it is given.

Named hosts (RunConfig.hosts) are off unless the operator turns them on (ARTWEB_NAMED_HOSTS: off, staff,
permitted, all). A run's hosts join its tracing hosts on the jail's CONNECT tunnel, where the egress guard
checks every connection (rollouts.sandbox.egress, rollouts.sandbox.tools); each connection, made or
refused, is listed in the batch's rollouts' logs and summed up per batch in the run's timeline
(egress_recorder).

Secrets (UserSecret) are a person's own, stored encrypted (training.exports.crypto) and never shown again
but for their last four characters. A run names the ones it needs (RunConfig.secrets); the worker decrypts
them at batch time and hands them to that batch's processes as environment variables, and the sandbox
scrubs their values from everything the batch returns. Neither the stored config nor an error ever holds a
value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from artweb.errors import ApplicationError
from rollouts.sandbox.tools import connections_summary, secret_name_problem
from training.config import RunConfig
from training.exports.crypto import SecretUnreadable, secret_decrypt, secret_encrypt
from training.models import Run, UserSecret

logger = logging.getLogger(__name__)

PERMISSION = "training.use_named_hosts"
MAX_SECRET_CHARS = 10_000
MAX_SECRETS = 100  # per person
EGRESS_EVENT = "egress"


# --- who may use named hosts ---------------------------------------------------------------------------


def named_hosts_allowed(user) -> bool:
    """Whether runs of `user` may list named hosts under this artweb's ARTWEB_NAMED_HOSTS."""
    mode = settings.ARTWEB_NAMED_HOSTS
    if mode == "all":
        return True
    if mode == "staff":
        return bool(user.is_staff)
    if mode == "permitted":
        return bool(user.is_staff or user.has_perm(PERMISSION))
    return False


def named_hosts_refusal() -> str:
    """Why a run may not list hosts here, and who can change that."""
    mode = settings.ARTWEB_NAMED_HOSTS
    if mode == "staff":
        return (
            "On this artweb only staff may give runs named hosts (ARTWEB_NAMED_HOSTS=staff): ask an administrator, "
            "or remove the hosts."
        )
    if mode == "permitted":
        return (
            "Your account may not give runs named hosts: an administrator can grant you, or a group of yours, "
            '"Can let runs reach named hosts" in the admin (users or groups, permissions). Or remove the hosts.'
        )
    return (
        "Named hosts are off on this artweb: the operator can turn them on with ARTWEB_NAMED_HOSTS "
        "(staff, permitted or all). Remove the hosts to launch the run without them."
    )


def run_tools_check(*, owner, cfg: RunConfig) -> None:
    """At a run's creation: its hosts are allowed to its owner, and every secret it names is theirs."""
    if cfg.hosts and not named_hosts_allowed(owner):
        raise ApplicationError(named_hosts_refusal(), field_errors={"hosts": [named_hosts_refusal()]})
    have = set(secret_list(owner=owner).filter(name__in=cfg.secrets).values_list("name", flat=True))
    missing = [name for name in cfg.secrets if name not in have]
    if missing:
        message = (
            f"You have no secret named {', '.join(missing)}: add it on the Secrets page (or with the API's "
            "secrets/ routes) first, or remove it from the run's secrets."
        )
        raise ApplicationError(message, field_errors={"secrets": [message]})


# --- secrets -------------------------------------------------------------------------------------------


def secret_list(*, owner) -> QuerySet[UserSecret]:
    """The person's own secrets: nobody else's, staff or not (a run uses its owner's only)."""
    return UserSecret.objects.filter(owner=owner)


def secret_get(*, owner, secret_id: int) -> UserSecret:
    return get_object_or_404(secret_list(owner=owner), id=secret_id)


def secret_mask_of(secret: UserSecret) -> str:
    """What a person sees of a stored value: dots, and its last four characters when it is long."""
    return f"••••{secret.value_last4}"


@transaction.atomic
def secret_set(*, owner, name: str, value: str) -> UserSecret:
    """Store a secret under `name`, or replace the value of the one of that name; returns it."""
    name = (name or "").strip()
    if (problem := secret_name_problem(name)) is not None:
        raise ApplicationError(problem, field_errors={"name": [problem]})
    if not value or len(value) > MAX_SECRET_CHARS or "\x00" in value:
        message = f"Give the secret's value: 1 to {MAX_SECRET_CHARS:,} characters, no NUL."
        raise ApplicationError(message, field_errors={"value": [message]})
    secret = secret_list(owner=owner).select_for_update().filter(name=name).first()
    if secret is None:
        if secret_list(owner=owner).count() >= MAX_SECRETS:
            raise ApplicationError(f"You already have {MAX_SECRETS} secrets; delete one you no longer use.")
        secret = UserSecret(owner=owner, name=name)
    secret.value_encrypted = secret_encrypt(value)
    secret.value_last4 = value[-4:] if len(value) >= 12 else ""
    try:
        with transaction.atomic():
            secret.save()
    except IntegrityError as exc:  # the same name saved at the same moment
        raise ApplicationError(f"A secret named {name} was saved meanwhile; try again.") from exc
    return secret


def secret_delete(*, secret: UserSecret) -> None:
    secret.delete()


# --- at batch time -------------------------------------------------------------------------------------


def run_tool_hosts(*, run: Run, cfg: RunConfig) -> tuple[str, ...]:
    """The run's named hosts for its next batch; ApplicationError when its owner may no longer use them."""
    if not cfg.hosts:
        return ()
    if not named_hosts_allowed(run.owner):
        raise ApplicationError(
            f"This run lists named hosts, which its owner may no longer use. {named_hosts_refusal()}"
        )
    return tuple(cfg.hosts)


def run_secrets_env(*, run: Run, cfg: RunConfig) -> dict[str, str]:
    """The run's secrets, name -> value, decrypted for its next batch only; ApplicationError naming (never
    showing) a secret that is gone or unreadable."""
    if not cfg.secrets:
        return {}
    stored = {s.name: s for s in secret_list(owner=run.owner).filter(name__in=cfg.secrets)}
    env = {}
    for name in cfg.secrets:
        if name not in stored:
            raise ApplicationError(
                f"The run needs the secret {name}, which its owner no longer has: add it again on the Secrets page."
            )
        try:
            env[name] = secret_decrypt(stored[name].value_encrypted)
        except SecretUnreadable:
            raise ApplicationError(
                f"The secret {name} cannot be decrypted (SECRET_KEY changed?): enter it again on the Secrets page."
            ) from None
    return env


def egress_recorder(*, run: Run, step: int) -> Callable[[list[dict]], None]:
    """What the sandbox calls with a batch's tunnel connections: one timeline event for the batch, when it
    made or was refused any. Never raises: the timeline must not fail the batch."""

    def record(connections: list[dict]) -> None:
        if not connections:
            return
        from training.services.runs import run_event  # runs checks a new run's tools with this module

        try:
            summary = connections_summary(connections)
            run_event(
                run=run,
                kind=EGRESS_EVENT,
                message=egress_message(step, summary),
                data={"step": step, **summary, "level": "warning" if summary["refused"] else "info"},
            )
        except Exception:
            logger.exception("The tunnel's connections could not be recorded", extra={"run_id": run.id})

    return record


def _size(n: int) -> str:
    return f"{n} B" if n < 1000 else f"{n / 1000:.1f} kB" if n < 1_000_000 else f"{n / 1_000_000:.1f} MB"


def egress_message(step: int, summary: dict) -> str:
    """The timeline's line for one batch: connections per host, bytes, and each refused host with why."""
    made = [f"{host} ×{row['connections']}" for host, row in summary["hosts"].items() if row["connections"]]
    parts = [
        f"Step {step}: {summary['connections']} tunnel connection(s)"
        + (f" ({', '.join(made)})" if made else "")
        + f", {_size(summary['sent'])} sent, {_size(summary['received'])} received"
    ]
    if summary["refused"]:
        why = "; ".join(f"{host}: {reason}" for host, reason in list(summary["refusals"].items())[:5])
        parts.append(f"{summary['refused']} refused ({why[:1500]})")
    return "; ".join(parts) + "."
