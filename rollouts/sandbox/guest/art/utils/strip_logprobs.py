"""`art.utils.strip_logprobs` (artweb_sdk.utils)."""

from artweb_sdk.utils import strip_logprobs  # noqa: F401
