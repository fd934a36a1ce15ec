"""`art.utils.iterate_dataset` (artweb_sdk.utils)."""

from artweb_sdk.utils import DatasetBatch, iterate_dataset  # noqa: F401
