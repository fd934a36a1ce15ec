"""A stand-in for Weights & Biases Weave, on the sandbox path only when the real one is not installed.

Rollout scripts written for ART often decorate with `@weave.op` and call `weave.init(...)`; tracing is
not available in the sandbox, so these do nothing and the script runs as written.
"""


def op(func=None, **_kwargs):
    if func is None:
        return lambda f: f
    return func


def init(*_args, **_kwargs):
    return None


def finish(*_args, **_kwargs):
    return None


def attributes(*_args, **_kwargs):
    import contextlib

    return contextlib.nullcontext()
