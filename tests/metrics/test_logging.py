"""Structured logs: run and step ids on every line, JSON in production, readable in development."""

import io
import json
import logging
import logging.config
import runpy
from pathlib import Path

import pytest
from celery import shared_task

from artweb import settings as artweb_settings
from artweb.logging import ConsoleFormatter, ContextFilter, JsonFormatter, log_context


@pytest.fixture
def lines():
    """A handler wired like settings.LOGGING's, on the root logger; yields (records, set_formatter)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)

    def read():
        return stream.getvalue().splitlines()

    read.handler = handler
    yield read
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_every_line_inside_a_context_carries_the_run_and_step(lines):
    with log_context(run_id=7, step=3):
        logging.getLogger("training.engine.trainer").info("loss %.2f", 0.5)
        with log_context(step=4):
            logging.getLogger("rollouts.sandbox").warning("slow rollout", extra={"rollout": 2})
    logging.getLogger("x").info("outside")
    a, b, c = (json.loads(line) for line in lines())
    assert a["run_id"] == 7 and a["step"] == 3 and a["message"] == "loss 0.50" and a["level"] == "INFO"
    assert a["logger"] == "training.engine.trainer" and a["ts"].endswith("Z")
    assert b["step"] == 4 and b["rollout"] == 2 and b["level"] == "WARNING"
    assert "run_id" not in c


def test_explicit_extra_wins_and_exceptions_are_kept(lines):
    with log_context(run_id=7):
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("x").exception("failed", extra={"run_id": 8, "step": 1})
    line = json.loads(lines()[0])
    assert line["run_id"] == 8 and line["step"] == 1 and "ValueError: boom" in line["exc"]


def test_the_run_log_service_lines_carry_ids(lines, alice):
    from artweb.testing.factories import RunFactory
    from training.services.logs import run_log

    run = RunFactory(owner=alice)
    run_log(run_id=run.id, step=2, message="step 2: 8 rollouts")
    line = next(json.loads(x) for x in lines() if "8 rollouts" in x)
    assert line["run_id"] == run.id and line["step"] == 2 and line["logger"] == "artweb.run"


@shared_task(name="tests.metrics.test_logging.a_run_task")
def a_run_task(run_id, step=None):
    logging.getLogger("training.tasks").info("working")


@shared_task(name="tests.metrics.test_logging.an_export_task")
def an_export_task(target_id, run_id):
    logging.getLogger("training.exports").info("exporting")


def test_celery_tasks_that_take_a_run_id_bind_it_for_their_lines(lines):
    a_run_task.apply(args=[5], kwargs={"step": 6})
    an_export_task.apply(args=[1, 9])
    logging.getLogger("x").info("after")
    records = [json.loads(x) for x in lines() if x.startswith("{")]
    working = next(r for r in records if r["message"] == "working")
    exporting = next(r for r in records if r["message"] == "exporting")
    after = next(r for r in records if r["message"] == "after")
    assert (working["run_id"], working["step"], working["task"]) == (5, 6, "tests.metrics.test_logging.a_run_task")
    assert working["task_id"]
    assert exporting["run_id"] == 9 and "step" not in exporting
    assert "run_id" not in after and "task_id" not in after  # the task's context ends with it


def test_development_lines_are_readable(lines):
    lines.handler.setFormatter(ConsoleFormatter())
    with log_context(run_id=7, step=3):
        logging.getLogger("training.services.steps").info("step done")
    (line,) = lines()
    assert line.endswith("INFO    training.services.steps [run 7 step 3] step done")


SETTINGS_FILE = Path(artweb_settings.__file__)
QUIET_LOGGERS = ("wandb", "weave", "httpx", "axes")


def settings_logging(monkeypatch, **env) -> dict:
    """settings.LOGGING as the settings module builds it under this environment (the module is run afresh;
    the settings of this test session are left as they are)."""
    for name in ("DEBUG", "LOG_FORMAT", "LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS_FILE))["LOGGING"]


@pytest.fixture
def configured():
    """Apply a LOGGING dict as Django does at start-up; yields apply(config) -> the lines its handler wrote.
    The process's own logging is put back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {name: logging.getLogger(name).level for name in QUIET_LOGGERS}

    def apply(config: dict):
        logging.config.dictConfig(config)
        (handler,) = root.handlers
        stream = io.StringIO()
        handler.setStream(stream)
        return lambda: stream.getvalue().splitlines()

    yield apply
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def test_production_settings_write_json_lines_with_the_run_and_step(monkeypatch, configured):
    lines = configured(settings_logging(monkeypatch, DEBUG="false", SECRET_KEY="s" * 50))
    with log_context(run_id=7, step=3):
        logging.getLogger("training.services.steps").info("step done")
    (line,) = (json.loads(x) for x in lines())
    assert (line["message"], line["level"], line["logger"]) == ("step done", "INFO", "training.services.steps")
    assert (line["run_id"], line["step"]) == (7, 3)


def test_development_settings_write_readable_lines(monkeypatch, configured):
    lines = configured(settings_logging(monkeypatch, DEBUG="true"))
    with log_context(run_id=7, step=3):
        logging.getLogger("training.services.steps").info("step done")
    (line,) = lines()
    assert line.endswith("INFO    training.services.steps [run 7 step 3] step done")


def test_log_format_and_log_level_choose_the_format_and_the_threshold(monkeypatch, configured):
    lines = configured(settings_logging(monkeypatch, LOG_FORMAT="json", LOG_LEVEL="WARNING"))
    logging.getLogger("training.tasks").info("routine")
    logging.getLogger("training.tasks").warning("worth reading")
    assert [json.loads(x)["message"] for x in lines()] == ["worth reading"]


def test_chatty_libraries_are_quiet_below_warnings(monkeypatch, configured):
    lines = configured(settings_logging(monkeypatch, LOG_FORMAT="json"))
    for name in QUIET_LOGGERS:
        # A library imported by an earlier test may have given its logger handlers of its own and stopped
        # propagation (wandb does): the settings' promise is about levels, so look at them alone.
        monkeypatch.setattr(logging.getLogger(name), "propagate", True)
        monkeypatch.setattr(logging.getLogger(name), "handlers", [])
    for name in QUIET_LOGGERS:
        logging.getLogger(f"{name}.client").info("sent a request")
        logging.getLogger(name).warning(f"{name} failed")
    logging.getLogger("training.tasks").info("ours")
    assert [json.loads(x)["message"] for x in lines()] == [f"{n} failed" for n in QUIET_LOGGERS] + ["ours"]
