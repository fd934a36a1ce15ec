"""`art.model` (artweb_sdk.model)."""

from artweb_sdk.model import Model, TrainableModel  # noqa: F401
