"""Where a worker answers the OpenAI endpoint's requests (training.services.serving_server.route), and that a
step never stops a server under a request answered beside it (training.services.inference.server_beside).

The routes are decided from the settings, the engine and the memory the machine reports: nothing starts.
The replacement test holds and replaces a stand-in server (a few attributes and methods of a real one), as
tests/serving/test_serving_gate.py holds the gate: what is tested is who waits for whom, with real threads;
tests/e2e/test_serve_during_step_e2e.py has the real servers."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from artweb.testing.factories import BaseModelFactory
from rollouts.inference.adapter_cache import SERVING_PREFIX
from training.services import inference, serving_server

pytestmark = pytest.mark.django_db

BLOCKED_S = 0.3  # how long a thread that should wait is given to (wrongly) get through


@pytest.fixture
def worker(settings, tmp_path, monkeypatch):
    """A CPU worker with no server running, the refusal of an earlier test forgotten."""
    settings.DATA_DIR = tmp_path / "data"
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cpu", "SERVE_THREADS": None, "SERVE_SERVER_GB": None}
    monkeypatch.setattr(serving_server, "_refused_until", 0.0)
    for name in ("_server", "_server_model", "_serving", "_serving_model"):
        monkeypatch.setattr(inference, name, None)
    monkeypatch.setattr(inference, "_engine", None)
    return settings


def configure(settings, **values) -> None:
    settings.ARTWEB = {**settings.ARTWEB, **values}


@pytest.fixture
def model(vllm_model_dir):
    return BaseModelFactory(name="default", local_path=str(vllm_model_dir))


def test_it_answers_beside_the_steps_on_a_server_with_runtime_adapters(worker, model):
    configure(worker, INFERENCE_ENGINE="vllm", VLLM_ADAPTER_MODE="lora")
    assert serving_server.route(model) == serving_server.BESIDE
    assert not serving_server.waits_for_steps()


@pytest.mark.parametrize("engine,mode", [("ctranslate2", "auto"), ("vllm", "merged")])
def test_a_merged_mode_worker_answers_on_a_server_of_its_own(worker, model, engine, mode):
    configure(worker, INFERENCE_ENGINE=engine, VLLM_ADAPTER_MODE=mode)
    assert serving_server.route(model) == serving_server.OWN
    assert not serving_server.waits_for_steps()


def test_without_threads_for_it_requests_wait_for_the_steps(worker, model):
    configure(worker, INFERENCE_ENGINE="ctranslate2", SERVE_THREADS=0)
    assert serving_server.route(model) == serving_server.GATE
    assert serving_server.waits_for_steps()


def test_a_second_server_that_does_not_fit_in_memory_is_refused_with_a_log_line(worker, model, caplog):
    configure(worker, INFERENCE_ENGINE="ctranslate2", SERVE_SERVER_GB=100_000)
    with caplog.at_level(logging.WARNING, logger="training.services.serving_server"):
        assert serving_server.route(model) == serving_server.GATE
    line = caplog.records[-1].getMessage()
    assert "no inference server of its own" in line and "100000.0 GiB" in line and "wait for a running step" in line
    assert serving_server.waits_for_steps()
    # The refusal holds for a while (no check, no new line, for each request) ...
    caplog.clear()
    configure(worker, SERVE_SERVER_GB=0.1)
    assert serving_server.route(model) == serving_server.GATE and not caplog.records
    # ... and once it is over, the second server is tried again.
    serving_server._refused_until = 0.0
    assert serving_server.route(model) == serving_server.OWN


def test_the_memory_estimate_of_the_default_model_counts_weights_cache_and_runtime(worker, model):
    configure(worker, INFERENCE_ENGINE="vllm", VLLM_ADAPTER_MODE="merged", VLLM_KV_CACHE_GB=None)
    need = serving_server.memory_needed(model) / serving_server.GiB
    assert 2.9 < need < 3.4  # 2.6 GiB of runtime, 0.25 of weights in bf16, 0.25 of KV cache
    configure(worker, INFERENCE_ENGINE="ctranslate2")
    assert 1.4 < serving_server.memory_needed(model) / serving_server.GiB < 1.8
    assert serving_server.memory_available() > 0


def test_the_second_server_computes_on_the_last_cores(worker):
    import os

    cores = sorted(os.sched_getaffinity(0))
    configure(worker, SERVE_THREADS=1)
    assert serving_server.cpus() == cores[-1:]
    configure(worker, SERVE_THREADS=10_000)
    assert serving_server.cpus() == cores  # never more than the worker has
    configure(worker, SERVE_THREADS=None)
    assert serving_server.cpus() == cores[-max(1, len(cores) // 4) :]


def test_a_step_retires_its_adapters_and_leaves_the_endpoints(vllm_model_dir):
    """InferenceServer.retire_adapters, on a server never started (retire_adapters only reads the names)."""
    from rollouts.inference.inference_server import InferenceServer

    class Server(InferenceServer):
        def _unload_lora(self, name: str) -> None:
            pass

    server = Server(str(vllm_model_dir), adapter_mode="lora")
    server.adapters = {"run-1@1": "/a", "run-1@2": "/b", f"{SERVING_PREFIX}run-1@1": "/a", "run-9@4": "/c"}
    server.retire_adapters(keep={"run-1@2"})
    assert server.adapters == {"run-1@2": "/b", f"{SERVING_PREFIX}run-1@1": "/a"}


def test_only_a_steps_adapters_hold_a_checkpoint_the_endpoints_copies_do_not(worker, vllm_model_dir, monkeypatch):
    """ART's delete_checkpoints after a step must not meet the copy its client's rollouts were answered with:
    those on the step's server under SERVING_PREFIX names, and those on the endpoint's second server."""
    from django.core.cache import cache

    from rollouts.inference.inference_server import InferenceServer

    step_server, second = (InferenceServer(str(vllm_model_dir)) for _ in range(2))
    step_server.adapters = {"run-1@2": "/ckpt/1/2", f"{SERVING_PREFIX}run-1@1": "/ckpt/1/1"}
    second.adapters = {"run-3@5": "/ckpt/3/5"}
    monkeypatch.setattr(inference, "_server", step_server)
    monkeypatch.setattr(inference, "_serving", second)
    inference.adapters_loaded_publish()
    assert cache.get("artweb:loaded_adapters") == ["/ckpt/1/2"]


class StandIn:
    """What inference_server() and server_beside() use of a running server."""

    merged = False
    adapter_mode = "lora"

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def is_alive(self) -> bool:
        return not self.stopped.is_set()

    def ensure_running(self) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped.set()


def test_a_step_never_stops_the_server_under_a_request_answered_beside_it(worker, model, vllm_model_dir, monkeypatch):
    other = BaseModelFactory(name="other", local_path=str(vllm_model_dir), chat_template_override="{{ messages }}")
    running = StandIn()
    monkeypatch.setattr(inference, "_server", running)
    monkeypatch.setattr(inference, "_server_model", inference._served_as(model))
    monkeypatch.setattr(inference, "_new_server", lambda *a, **kw: StandIn())
    monkeypatch.setattr(inference, "_start_failures", {})
    inference.model_files_check(str(vllm_model_dir))  # its imports, once, before the timed part

    held, release = threading.Event(), threading.Event()

    def request() -> None:
        with inference.server_beside(model) as server:
            assert server is running
            held.set()
            assert release.wait(10)

    answering = threading.Thread(target=request, daemon=True)
    answering.start()
    assert held.wait(5)
    switched = threading.Event()
    step = threading.Thread(target=lambda: (inference.inference_server(other), switched.set()), daemon=True)
    step.start()
    try:
        # The step checks the other model's files and then waits for the request.
        deadline = time.monotonic() + 60
        while not inference._replacing and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inference._replacing
        assert not switched.wait(BLOCKED_S) and running.is_alive()
        with inference.server_beside(model) as late:
            assert late is None  # a new request is held back (it goes through the gate instead)
        release.set()
        assert switched.wait(5)
        assert running.stopped.is_set() and inference._server_model == inference._served_as(other)
    finally:
        release.set()
        answering.join(5)
        step.join(5)
    with inference.server_beside(model) as server:
        assert server is None  # the server holds another model now


class Request:
    """A thread holding a policy of training.serving.worker.Policies, as a request being answered does."""

    def __init__(self, policies, policy, name: str, entered: list):
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(policies, policy, name, entered), daemon=True)
        self.thread.start()

    def _run(self, policies, policy, name, entered) -> None:
        with policies.hold(policy):
            entered.append(name)
            assert self.release.wait(10)

    def done(self) -> None:
        self.release.set()
        self.thread.join(5)


def _settle() -> None:
    time.sleep(BLOCKED_S)


def test_requests_for_one_policy_are_let_in_together_on_a_server_that_holds_one(worker):
    """On a server that holds one policy at a time, requests alternating between two policies are let in a
    turn at a time: the oldest waiting request's, with every request for its policy waiting then."""
    from training.serving.worker import Policies, Policy

    policies, entered = Policies(), []
    base, checkpoint = Policy("m"), Policy("m", "run-1@1", "/c")
    first = Request(policies, base, "base-1", entered)
    _settle()
    queued = []
    for name, policy in (("ckpt-1", checkpoint), ("base-2", base), ("ckpt-2", checkpoint)):
        queued.append(Request(policies, policy, name, entered))
        _settle()
    assert entered == ["base-1"]  # base-2 came after ckpt-1, which waits for base-1: it waits too
    first.done()
    _settle()
    assert entered == ["base-1", "ckpt-1", "ckpt-2"]  # one turn of the checkpoint, ckpt-2 before base-2
    late = Request(policies, checkpoint, "ckpt-3", entered)
    _settle()
    assert entered[-1] == "ckpt-2"  # it came after the turn started: behind base-2
    queued[0].done()
    queued[2].done()
    _settle()
    assert entered == ["base-1", "ckpt-1", "ckpt-2", "base-2"]
    queued[1].done()
    _settle()
    assert entered[-1] == "ckpt-3"
    late.done()
