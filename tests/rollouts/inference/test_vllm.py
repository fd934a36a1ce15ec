"""The inference servers themselves, as the session started them (default model): vLLM's CPU build and
artweb's CTranslate2 server, each test against both (`inference_server`), but for vLLM's own admin routes.
Rollouts through them are tests/rollouts/sandbox/test_on_servers.py."""

import time

import httpx
import pytest

pytestmark = pytest.mark.vllm


def _greedy(server, model: str, *, logprobs: bool = False):
    """The greedy answer's text, or with logprobs=True (token ids, log-probs) of each generated token."""
    response = httpx.post(
        f"{server.base_url}/chat/completions",
        timeout=300,
        headers=server.headers,
        json={
            "model": model,
            "messages": [{"role": "user", "content": "Name three fruits."}],
            "max_tokens": 12,
            "temperature": 0.0,
            "logprobs": logprobs,
            "return_token_ids": logprobs,
        },
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    if not logprobs:
        return choice["message"]["content"]
    return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def test_it_serves_a_steps_adapter_and_gives_the_base_back(inference_server, tmp_path):
    from artweb.testing.weights import make_adapter

    base_ids, base_logprobs = _greedy(inference_server, inference_server.ensure_base(), logprobs=True)
    adapter = make_adapter(tmp_path / "step1", seed=1, std=0.05)
    name = inference_server.ensure_adapter("run-1@1", str(adapter))
    assert name == "run-1@1" and inference_server.loaded_adapter_paths() == {str(adapter)}
    # The adapter moves the model: another answer, or the same one at other probabilities. (A small random
    # adapter need not change a greedy answer on every processor; its log-probs always move.)
    ids, logprobs = _greedy(inference_server, name, logprobs=True)
    assert ids != base_ids or max(abs(a - b) for a, b in zip(logprobs, base_logprobs, strict=True)) > 0.01
    inference_server.retire_adapters(keep=set())
    assert inference_server.loaded_adapter_paths() == set()
    ids, logprobs = _greedy(inference_server, inference_server.ensure_base(), logprobs=True)
    assert ids == base_ids and logprobs == pytest.approx(base_logprobs, abs=1e-3)


def _same(answer, other) -> bool:
    """Two greedy answers (token ids, log-probs) of the same weights: the same tokens, log-probs within
    the server's rounding."""
    return answer[0] == other[0] and answer[1] == pytest.approx(other[1], abs=1e-3)


def test_each_steps_merged_weights_go_over_the_previous_steps(vllm_server, tmp_path):
    """In merged mode a step's weights are written over the last step's merged copy; what the server
    answers must be what a copy merged from scratch gives, and rewriting the file must not reach the
    weights the server has already loaded."""
    from artweb.testing.weights import make_adapter
    from rollouts.inference.merge import merge_adapter, rewrite_merged

    if not vllm_server.merged:
        pytest.skip("this vLLM build serves adapters side by side (lora mode), not merged")
    first = make_adapter(tmp_path / "step1", seed=11, std=0.05)
    second = make_adapter(tmp_path / "step2", seed=12, std=0.05)
    vllm_server.ensure_adapter("run-2@1", str(first))
    answer_1 = _greedy(vllm_server, "run-2@1", logprobs=True)
    merged = vllm_server.work_dir / "merged"
    assert (merged / "run-2_1").is_dir()

    vllm_server.ensure_adapter("run-2@2", str(second))
    assert (merged / "run-2_2").is_dir() and not (merged / "run-2_1").exists()  # moved, then rewritten
    answer_2 = _greedy(vllm_server, "run-2@2", logprobs=True)
    assert not _same(answer_2, answer_1)

    # The file written over while step 2 is served: the server still answers with step 2's weights.
    assert rewrite_merged(vllm_server.model_path, first, merged / "run-2_2")
    assert _same(_greedy(vllm_server, "run-2@2", logprobs=True), answer_2)

    vllm_server.ensure_adapter("run-2@1", str(first))  # rewritten again: nothing of step 2 is left
    assert _same(_greedy(vllm_server, "run-2@1", logprobs=True), answer_1)
    assert (merged / "run-2_1").is_dir() and not (merged / "run-2_2").exists()
    # Step 2 merged from scratch into a folder of its own gives the same answers.
    vllm_server.load_merged(
        "run-2@2-fresh", str(second), str(merge_adapter(vllm_server.model_path, second, tmp_path / "fresh"))
    )
    assert _same(_greedy(vllm_server, "run-2@2-fresh", logprobs=True), answer_2)

    vllm_server.ensure_base()


def test_the_cpu_builds_engine_does_not_spin_after_a_batch(vllm_server):
    """vLLM's queue readers spin a full core for a second after every burst of requests unless artweb's
    plugin (rollouts.inference.vllm_plugin, loaded by vLLM in each of its processes) cuts that short. On
    a machine short of CPU a spinning engine could get less than a core here, never more: the check can
    miss the spin there, but not report one that is not."""
    import asyncio

    import psutil

    from rollouts.inference.vllm_plugin import BUSY_LOOP_ENV

    if not vllm_server.cpu_build:
        pytest.skip("only the CPU build is told to stop spinning; a GPU host has cores to spare")
    assert vllm_server.environment()[BUSY_LOOP_ENV] == "0.05"
    tree = [psutil.Process(vllm_server._proc.pid)]
    tree += tree[0].children(recursive=True)

    def cpu_seconds() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in tree if p.is_running())

    async def batch() -> None:
        async with httpx.AsyncClient(timeout=300, headers=vllm_server.headers) as client:
            body = {"model": vllm_server.ensure_base(), "messages": [{"role": "user", "content": "Count."}]}
            body.update(max_tokens=16, ignore_eos=True)
            replies = await asyncio.gather(
                *[client.post(f"{vllm_server.root_url}/v1/chat/completions", json=body) for _ in range(8)]
            )
            assert all(r.status_code == 200 for r in replies)

    asyncio.run(batch())
    before = cpu_seconds()
    time.sleep(1.0)
    assert cpu_seconds() - before < 0.3  # spinning: ~1 CPU-second in this second


def test_it_restarts_a_dead_server(inference_server):
    import os
    import signal

    os.killpg(inference_server._proc.pid, signal.SIGKILL)
    inference_server._proc.wait(timeout=30)
    assert not inference_server.is_alive()
    inference_server.ensure_running()
    assert inference_server.is_alive()
    assert _greedy(inference_server, inference_server.ensure_base())


# Routes that would hand a caller the server itself; vLLM's own key check covers none outside /v1.
ADMIN_ROUTES = [
    ("POST", "/collective_rpc"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("POST", "/pause"),
    ("GET", "/metrics"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("POST", "/tokenize"),
    ("POST", "/v1/chat/completions"),
    ("OPTIONS", "/v1/chat/completions"),
]


def test_every_route_but_health_needs_the_servers_key(vllm_server):
    """Checked route by route against the server's own list, so a route a vLLM upgrade adds is covered
    too. (The key's holder loading an adapter: test_it_serves_a_steps_adapter_and_gives_the_base_back.)"""
    root = vllm_server.root_url
    spec = httpx.get(f"{root}/openapi.json", headers=vllm_server.headers, timeout=30)
    assert spec.status_code == 200
    listed = {
        (method.upper(), path.replace("{", "").replace("}", ""))
        for path, methods in spec.json()["paths"].items()
        for method in methods
    }
    assert ("POST", "/v1/chat/completions") in listed and ("POST", "/v1/load_lora_adapter") in listed
    with httpx.Client(base_url=root, timeout=30) as client:
        for method, path in sorted(listed | set(ADMIN_ROUTES)):
            if path == "/health":
                continue
            for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": vllm_server.api_key}):
                response = client.request(method, path, headers=headers)
                assert response.status_code == 401, (method, path, headers, response.status_code, response.text)
        assert client.get("/health").status_code == 200
        assert client.get("/v1/models", headers=vllm_server.headers).status_code == 200
        assert client.post("/reset_prefix_cache", headers=vllm_server.headers).status_code == 200
    assert vllm_server.api_key not in " ".join(vllm_server.command())
