"""`art.utils.format_message` (artweb_sdk.utils)."""

from artweb_sdk.utils import format_message  # noqa: F401
