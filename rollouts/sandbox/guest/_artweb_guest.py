"""The sandbox process: runs a person's rollout script and reward function on a batch of groups.

Started by rollouts.sandbox.process with a clean environment, resource limits and a working directory
of its own; never imported by artweb itself. It may be started before its batch is known: it then
first imports the SDK and the OpenAI client (about a CPU-second that the batch need not wait for). It
waits for one line on its control pipe, the batch's environment, which says that the batch's files
are in place. No user code is loaded before that line. Then it reads the batch description (a JSON file
named on the command line), runs every rollout concurrently on one asyncio loop, and writes one JSON
line per finished trajectory to the result pipe, so whatever was finished survives if this process dies.

This file is the program and sets up its import path; its parts are the package beside it,
_artweb_runner (a name no script's own module takes): user_code (logs, errors and the process budget
around the person's code), results (the result pipe and each record's shape and size), batch (rollouts
and their scoring, under the watchdog), scoring (stored trajectories scored again) and relay (the way
out of the jail).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Our `art` package must win over a real openpipe-art install; the weave stand-in must lose to a real
# weave, so it goes last on the path. The guest's own package, _artweb_runner, is found here too.
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "guest_fallbacks"))

from _artweb_runner import results
from _artweb_runner.batch import Batch
from _artweb_runner.relay import start_relay
from _artweb_runner.results import ResultPipe
from _artweb_runner.scoring import ScoreBatch
from _artweb_runner.user_code import RoutedStream, limit_processes
from artweb_sdk.model import Endpoint


def warm_up() -> None:
    """Import what every rollout script uses: the SDK (imported above), `art`, and the OpenAI client with
    the modules its first chat completion loads, and build the SDK client's TLS context; each would
    otherwise cost the batch's first requests their time. Nothing here opens a connection."""
    # httpcore opens its connections through anyio's asyncio backend, imported on the first one.
    import anyio._backends._asyncio  # noqa: F401
    import art
    import httpcore._backends.anyio  # noqa: F401

    handle = art.TrainableModel(name="warm-up", _endpoint=Endpoint(base_url="http://127.0.0.1:9/v1"))
    _ = handle.openai_client().chat.completions  # its first access imports the chat resources and HTTP/1.1


MAX_CONTROL_BYTES = 1 << 20


def wait_for_batch(fd: int) -> tuple[dict[str, str], bool]:
    """Block until the worker sends the batch's environment (one JSON line); exit quietly if it closes the
    pipe instead (a pre-started process that no batch took). The pipe stays open for the worker's report
    request before the deadline (Batch.watch_deadline); True when that came already, with the environment."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 65536)
        if not chunk or len(data) > MAX_CONTROL_BYTES:
            os._exit(0)
        data += chunk
    line, _, rest = data.partition(b"\n")
    message = json.loads(line)
    return {str(k): str(v) for k, v in message["env"].items()}, bool(rest)


def main() -> None:
    if os.environ.pop("ARTWEB_WARM_UP", "") == "1":  # started ahead of its batch: the imports are free now
        warm_up()
    control_fd = int(os.environ.pop("ARTWEB_CONTROL_FD"))
    env, report_asked = wait_for_batch(control_fd)
    os.environ.update(env)
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    results.MAX_RECORD_BYTES = int(spec.get("record_bytes", results.MAX_RECORD_BYTES))
    pipe = ResultPipe(int(os.environ["ARTWEB_RESULT_FD"]))
    port = start_relay(os.environ["ARTWEB_PROXY_SOCKET"])
    os.environ["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
    if os.environ.get("ARTWEB_EGRESS_SOCKET"):
        # HTTPS to the run's own tracing service only (the worker's proxy checks the host); the model
        # stays on the plain local relay.
        os.environ["HTTPS_PROXY"] = f"http://127.0.0.1:{start_relay(os.environ['ARTWEB_EGRESS_SOCKET'])}"
        os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    sys.stdout = RoutedStream(sys.__stdout__)
    sys.stderr = RoutedStream(sys.__stderr__)
    limit_processes(int(spec["max_processes"]))
    weave = _weave_start()
    batch = (ScoreBatch if spec.get("mode") == "score" else Batch)(spec, pipe)
    if isinstance(batch, ScoreBatch):
        os.close(control_fd)  # its trajectories' scores are each kept as they come; nothing to report
    else:
        batch.watch_deadline(control_fd, asked=report_asked)
    batch.load(spec_path.parent)
    asyncio.run(batch.run())
    _weave_finish(weave)
    pipe.send({"kind": "done"})
    # Every result is sent and the worker kills the sandbox once it reads "done": skip the interpreter's
    # teardown (a few hundred ms of CPU with the OpenAI client loaded, taken from the batch's other
    # sandboxes) and whatever exit hooks or threads the script left.
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError):  # a log past its size limit, a closed stream: nothing left to say
            pass
    os._exit(0)


def _weave_start():
    """With the run's Weave project configured, trace @weave.op calls into it; a Weave that cannot
    start (no server, bad key) is switched off with one line in the log and never fails a rollout."""
    project = os.environ.get("WEAVE_PROJECT")
    if not project:
        return None
    try:
        import weave

        return weave.init(project)
    except Exception as exc:
        os.environ["WEAVE_DISABLED"] = "true"
        print(f"Weave tracing is off for this batch: {type(exc).__name__}: {exc}", file=sys.__stderr__)
        return None


def _weave_finish(client) -> None:
    if client is None:
        return
    done = threading.Event()

    def flush():
        try:
            client.finish()
        except Exception:
            pass
        done.set()

    threading.Thread(target=flush, daemon=True).start()
    done.wait(10.0)  # flushing traces must not hold the batch's results back for long


if __name__ == "__main__":
    main()
