"""The serving workers' adapter cache on a real vLLM server (CPU build: merged weights kept on disk)."""

from artweb.testing.weights import make_adapter
from rollouts.inference.adapter_cache import AdapterCache


def _greedy(server, name: str) -> str:
    import httpx

    answer = httpx.post(
        f"{server.base_url}/chat/completions",
        headers=server.headers,
        json={
            "model": name,
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=300,
    ).json()
    return answer["choices"][0]["message"]["content"]


def test_it_keeps_the_most_recently_used_adapters_and_serves_each_as_loaded(vllm_server, tmp_path):
    cache = AdapterCache(vllm_server, capacity=2)
    paths = {n: str(make_adapter(tmp_path / n, seed=k, std=0.05)) for k, n in enumerate(["a@1", "b@1", "c@1"])}
    first = {}
    for name, path in paths.items():
        assert cache.ensure(name, path) == name
        first[name] = _greedy(vllm_server, name)
    assert cache.names() == ["b@1", "c@1"]  # a@1, the least recently used, went out
    assert cache.last_load_s is not None
    # Back to b@1: the same weights as before (kept, not merged again), and it becomes the most recent.
    cache.ensure("b@1", paths["b@1"])
    assert _greedy(vllm_server, "b@1") == first["b@1"]
    assert cache.names() == ["c@1", "b@1"]
    if vllm_server.merged:
        kept = {p.name for p in (vllm_server.work_dir / "serve-cache").iterdir()}
        assert {"b_1", "c_1"} <= kept and "a_1" not in kept
    # a@1 again: loaded anew, same answer as the first time.
    cache.ensure("a@1", paths["a@1"])
    assert _greedy(vllm_server, "a@1") == first["a@1"]
    cache.clear()
    vllm_server.ensure_base()
