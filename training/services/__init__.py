from training.services.base_models import base_model_recommend, base_model_register
from training.services.runs import (
    run_actions,
    run_cancel,
    run_create,
    run_event,
    run_pause,
    run_resume,
    run_retry,
    run_transition,
)

__all__ = [
    "base_model_recommend",
    "base_model_register",
    "run_actions",
    "run_cancel",
    "run_create",
    "run_event",
    "run_pause",
    "run_resume",
    "run_retry",
    "run_transition",
]
