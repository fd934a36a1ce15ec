"""Where a step's rollouts phase spends its time outside the model: the shipped example's batch (4 scenarios x
a group of 6, at most 48 completion tokens) in the production jail, against an inference server that
answers at once.

    python -m bench.rollout_overhead                 # 5 cold and 5 pre-started batches, alternating
    python -m bench.rollout_overhead --repeat 10 --sandboxes 4
    python -m bench.rollout_overhead --bundle        # also the same script as a bundle, alternating

With --bundle the script also runs as a bundle (rollouts.sandbox.bundles): its rollout.py imports a helper
module beside it and reads a data file, as multi-file scripts do, and the bundle's files are written into
every sandbox's box; the last lines compare each kind's median `returned` with the plain script's.

Why a stand-in server: on a GPU a step's rollouts took 3.4-10 s where generating the same completions
takes about 1 s, so most of that time is artweb's own (the jail, the sandbox processes and their imports,
the inference proxy, the reward, the records). A server that answers every chat completion immediately
with a short fixed reply (with the logprobs and vLLM's `token_ids` a real one returns, and refusing any
request without the key the proxy adds) takes generation out of the measurement, so what is left is that
overhead. It is the only stand-in: the jail, the sandbox processes, the proxy, the guest, the example's
rollout script and reward function are the production ones. This is a benchmark, not a test: it asserts
nothing and its figures depend on the machine, whose CPU it prints.

Each batch prints its timeline in ms from the moment run_rollouts was called:

    jail      the batch's jail and processes are started (cold: bwrap launched; pre-started: taken)
    handed    its files written, the proxy socket open and the go sent
    loaded    the rollout script was loaded in the sandbox (interpreter and SDK imports done)
    client    the first rollout has its OpenAI client (the openai import done)
    req1      the first request reached the inference proxy
    last_ans  the last answer left the proxy
    rewards   the last reward function call returned (inside the sandbox)
    records   the last trajectory record reached the worker
    said_done the last sandbox's "done" line reached the worker
    returned  run_rollouts returned (sandboxes killed, jail removed, the next batch pre-started)

and, after it, in ms: `close` (ending the batch's processes and jail), `proxy_close` (closing its proxy
socket), `next` (pre-starting the next batch) and `inflight`, the most requests the server held at once.
The script and reward are the shipped example's, each wrapped to note wall-clock times (the jail shares
the host's clock) in the trajectory's metadata. A pre-started batch is started by the batch before it,
as a run's step starts its next one; --settle gives it the time a step's update would.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import secrets
import statistics
import threading
import time
from pathlib import Path

from aiohttp import web

from bench.task import EXAMPLES, load_scenarios
from rollouts.sandbox import prestart, process
from rollouts.sandbox.batch import SandboxLimits, default_sandboxes
from rollouts.sandbox.bundles import Bundle, bundle_store
from rollouts.sandbox.jail import JailConfig
from rollouts.sandbox.prestart import prestarted
from rollouts.sandbox.proxy import InferenceProxy
from rollouts.sandbox.rollouts import RolloutRequest, run_rollouts

REPLY = "The blue sea is calm and bright."
REPLY_TOKEN_IDS = [504, 3840, 1891, 314, 4689, 284, 5476, 30]  # eight ids below SmolLM2's 49152
VOCAB_SIZE = 49152

# Appended to the example's own files: each wrapper notes wall-clock times, then does what the file did.
SCRIPT_TIMES = """

import time as _bench_time

_BENCH_LOADED = _bench_time.time()
_bench_rollout = rollout


async def rollout(model, scenario):
    started = _bench_time.time()
    model.openai_client()
    client = _bench_time.time()
    trajectory = await _bench_rollout(model, scenario)
    trajectory.metadata.update(
        t_loaded=_BENCH_LOADED, t_started=started, t_client=client, t_rollout=_bench_time.time()
    )
    return trajectory
"""

REWARD_TIMES = """

import time as _bench_time

_bench_reward = reward


def reward(trajectory, scenario):
    value = _bench_reward(trajectory, scenario)
    trajectory.metadata["t_reward"] = _bench_time.time()
    return value
"""


class InstantServer:
    """OpenAI-compatible chat completions on 127.0.0.1, answered at once, on a thread of its own."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.port = 0
        self.arrivals: list[float] = []
        self.inflight = 0
        self.max_inflight = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> InstantServer:
        threading.Thread(target=self._serve, name="instant-server", daemon=True).start()
        if not self._ready.wait(10):
            raise RuntimeError("the instant server did not start")
        return self

    def reset(self) -> None:
        self.arrivals.clear()
        self.max_inflight = 0

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _chat(self, request: web.Request) -> web.Response:
        self.arrivals.append(time.time())
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response({"error": {"message": "bad key", "code": "unauthorized"}}, status=401)
            body = await request.json()
            # Yield once, so requests that arrive together are held together (in flight at once).
            await asyncio.sleep(0)
            return web.json_response(_completion(body))
        finally:
            self.inflight -= 1


def _completion(body: dict) -> dict:
    content = [
        {"token": f"t{i}", "logprob": -0.25, "bytes": None, "top_logprobs": []} for i in range(len(REPLY_TOKEN_IDS))
    ]
    return {
        "id": f"chatcmpl-{secrets.token_hex(8)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY},
                "logprobs": {"content": content} if body.get("logprobs") else None,
                "finish_reason": "stop",
                "token_ids": REPLY_TOKEN_IDS if body.get("return_token_ids") else None,
            }
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": len(REPLY_TOKEN_IDS), "total_tokens": 48},
    }


class Probes:
    """Wall-clock times the worker side notes while a batch runs (the wrappers change nothing they wrap)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def note(self, name: str, at: float | None = None) -> None:
        self.times.setdefault(name, []).append(time.time() if at is None else at)

    def reset(self) -> None:
        self.times = {}

    def install(self) -> None:
        started_batch = prestart.StartedBatch
        original_start = started_batch.start.__func__
        original_hand_over = started_batch.hand_over
        original_close = started_batch.close
        original_take = prestarted.take
        original_add = prestarted.add
        original_handle = InferenceProxy._handle
        original_proxy_close = InferenceProxy.close
        original_accept = process.Sandbox._accept
        probes = self

        def start(cls, shape, *, prefix, box_type=None, ahead=False):
            batch = original_start(cls, shape, prefix=prefix, box_type=box_type, ahead=ahead)
            if not ahead:
                probes.note("jail")
            return batch

        def take(key, shape):
            batch = original_take(key, shape)
            if batch is not None:
                probes.note("jail")
            return batch

        def hand_over(self, request):
            original_hand_over(self, request)
            probes.note("handed")

        def close(self):
            t = time.time()
            original_close(self)
            probes.note("close_s", time.time() - t)

        def add(key, shape):
            t = time.time()
            original_add(key, shape)
            probes.note("next_s", time.time() - t)

        async def handle(self, sock, request):
            probes.note("req")
            try:
                return await original_handle(self, sock, request)
            finally:
                probes.note("ans")

        def proxy_close(self, socket_path):
            t = time.time()
            original_proxy_close(self, socket_path)
            probes.note("proxy_close_s", time.time() - t)

        def accept(self, message, size):
            original_accept(self, message, size)
            if message.get("kind") == "done":
                probes.note("said_done")

        process.Sandbox._accept = accept
        InferenceProxy.close = proxy_close
        started_batch.start = classmethod(start)
        started_batch.hand_over = hand_over
        started_batch.close = close
        prestarted.take = take
        prestarted.add = add
        InferenceProxy._handle = handle


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


COLUMNS = ("jail", "handed", "loaded", "client", "req1", "last_ans", "rewards", "records", "said_done", "returned")
EXTRA = ("close", "proxy_close", "next", "inflight")
WIDTH = 12


def one_batch(request: RolloutRequest, server: InstantServer, probes: Probes) -> dict[str, float]:
    server.reset()
    probes.reset()
    arrived: list[float] = []
    t0 = time.time()
    results = run_rollouts(request, on_trajectory=lambda g, i, r: arrived.append(time.time()))
    done = time.time()
    records = [t for group in results for t in group.trajectories]
    errors = [t["error"] for t in records if t["error"]]
    if errors:
        raise RuntimeError(f"{len(errors)} rollouts failed; the first:\n{errors[0]}")
    if len(server.arrivals) != len(records):
        raise RuntimeError(f"{len(server.arrivals)} requests reached the server for {len(records)} rollouts")
    meta = [t["metadata"] for t in records]
    p = probes.times

    def ms(at: float) -> float:
        return (at - t0) * 1000

    return {
        "jail": ms(p["jail"][0]),
        "handed": ms(p["handed"][0]),
        "loaded": ms(min(m["t_loaded"] for m in meta)),
        "client": ms(min(m["t_client"] for m in meta)),
        "req1": ms(min(p["req"])),
        "last_ans": ms(max(p["ans"])),
        "rewards": ms(max(m["t_reward"] for m in meta)),
        "records": ms(max(arrived)),
        "said_done": ms(max(p["said_done"])),
        "returned": ms(done),
        "close": p["close_s"][0] * 1000,
        "proxy_close": sum(p["proxy_close_s"]) * 1000,
        "next": sum(p.get("next_s", [])) * 1000,
        "inflight": float(server.max_inflight),
    }


BUNDLE_HELPER = "WORDS = ('blue', 'green', 'cold')\n\n\ndef known(word):\n    return word in WORDS\n"
BUNDLE_IMPORTS = "import json\nfrom pathlib import Path\n\nfrom helpers import known\n\n"
BUNDLE_READS = "\n_WORDS = json.loads((Path(__file__).parent / 'data' / 'words.json').read_text())\n"


def as_bundle(request: RolloutRequest, into: Path) -> RolloutRequest:
    """The request's script as a bundle: its rollout.py imports helpers.py and reads data/words.json."""
    rollout_py = BUNDLE_IMPORTS + request.script + BUNDLE_READS
    files = {
        "data/words.json": b'["blue", "green", "cold"]',
        "helpers.py": BUNDLE_HELPER.encode(),
        "rollout.py": rollout_py.encode(),
    }
    path = bundle_store(Bundle(files=dict(sorted(files.items()))), into)
    return dataclasses.replace(request, script=rollout_py, bundle=path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="batches of each kind (cold, pre-started)")
    parser.add_argument("--sandboxes", type=int, default=None, help="sandbox processes (default: as production)")
    parser.add_argument("--concurrency", type=int, default=32, help="rollouts in flight (a run's default: 32)")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds between batches (a pre-started batch imports meanwhile)"
    )
    parser.add_argument("--bundle", action="store_true", help="also run the script as a bundle, alternating")
    args = parser.parse_args()

    print(f"{cpu_name()}, {os.cpu_count()} cores; sandbox processes: {args.sandboxes or default_sandboxes()}")
    api_key = secrets.token_urlsafe(16)
    server = InstantServer(api_key).start()
    probes = Probes()
    probes.install()
    scenarios = load_scenarios()["train"][:4]
    request = RolloutRequest(
        script=(EXAMPLES / "rollout.py").read_text() + SCRIPT_TIMES,
        reward=(EXAMPLES / "reward.py").read_text() + REWARD_TIMES,
        scenarios=scenarios,
        group_size=6,
        base_url=server.base_url,
        model_name="policy@1",
        api_key=api_key,
        sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 48},
        concurrency=args.concurrency,
        max_exceptions=0,
        limits=SandboxLimits(rollout_timeout_s=120.0),
        sandboxes=args.sandboxes,
        jail=JailConfig(),
        vocab_size=VOCAB_SIZE,
    )
    warm = dataclasses.replace(request, warm_key="bench-overhead", prestart_next=True)
    run_rollouts(warm)  # the first pre-started batch, and the process's one-time costs (jail check, proxy)
    kinds = [("prestarted", warm), ("cold", request)]
    if args.bundle:
        bundle = as_bundle(request, Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-bundles-{os.getpid()}")
        warm_bundle = dataclasses.replace(bundle, warm_key="bench-overhead-bundle", prestart_next=True)
        run_rollouts(warm_bundle)
        kinds += [("pre+bundle", warm_bundle), ("cold+bundle", bundle)]
    rows: dict[str, list[dict[str, float]]] = {kind: [] for kind, _ in kinds}
    header = f"{'batch':12}" + "".join(f"{c:>{WIDTH}}" for c in (*COLUMNS, *EXTRA))
    print(f"\ntimeline of each batch, ms from the call (24 rollouts, {args.settle:g} s between batches)")
    print(header)
    try:
        for _ in range(args.repeat):
            for kind, req in kinds:
                time.sleep(args.settle)
                row = one_batch(req, server, probes)
                rows[kind].append(row)
                print(f"{kind:12}" + "".join(f"{row[c]:{WIDTH}.0f}" for c in (*COLUMNS, *EXTRA)), flush=True)
    finally:
        prestarted.discard()
    print(f"\nmedian of {args.repeat}")
    print(header)
    for kind, found in rows.items():
        medians = [statistics.median(r[c] for r in found) for c in (*COLUMNS, *EXTRA)]
        print(f"{kind:12}" + "".join(f"{m:{WIDTH}.0f}" for m in medians), flush=True)
    if args.bundle:
        returned = {kind: statistics.median(r["returned"] for r in found) for kind, found in rows.items()}
        for script_kind, bundle_kind in (("prestarted", "pre+bundle"), ("cold", "cold+bundle")):
            ratio = returned[bundle_kind] / returned[script_kind]
            print(f"bundle / script, {script_kind} batches (median returned): {ratio:.3f} ({ratio - 1:+.1%})")


if __name__ == "__main__":
    main()
