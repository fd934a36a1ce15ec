"""`art.utils`: ART's helpers for rollout scripts (artweb_sdk.utils).

Each submodule is imported first and its function then takes its name, as in ART, so both
`from art.utils import retry` and `from art.utils.retry import retry` give the function.
"""

from artweb_sdk.utils import get_model_step, log_http_errors, record_provenance

from .format_message import format_message
from .iterate_dataset import DatasetBatch, iterate_dataset
from .limit_concurrency import limit_concurrency
from .retry import retry
from .strip_logprobs import strip_logprobs

__all__ = [
    "DatasetBatch",
    "format_message",
    "get_model_step",
    "iterate_dataset",
    "limit_concurrency",
    "log_http_errors",
    "record_provenance",
    "retry",
    "strip_logprobs",
]
