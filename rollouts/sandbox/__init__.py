"""The sandbox that runs a person's code: the jail (jail, cgroups, mounts, seccomp, uid_lease), the guest
program and SDK that run inside it (guest/, with guest_fallbacks/), the worker's side of a batch (rollouts,
scores, batch, prestart, process), the one reader of what a sandbox sends back (reader, records), the
inference proxy that is its only way out (proxy, proxy_rules), the egress guard and its tunnels (egress,
tunnel), RULER's worker side (ruler), bounded JSON (jsonsafe), and the checks of uploaded code (validation).
Pure: never imports Django, the apps, or the inference servers; services turn rows into its typed requests.

The errors its callers catch live here, so that every module of the package can raise them.
"""


class Cancelled(Exception):
    """should_stop() said stop: the sandbox was killed and no results are returned, or the trainer
    (training.engine, which raises this same class) stopped an update before its optimizer step."""


class TooManyErrors(RuntimeError):
    """More rollouts failed than the request's max_exceptions allows; `groups` holds what finished."""

    def __init__(self, message: str, groups: list | None = None) -> None:
        super().__init__(message)
        self.groups = groups or []


class JailUnavailable(RuntimeError):
    """The jail cannot be built on this machine; the message says what the operator must install or enable."""
