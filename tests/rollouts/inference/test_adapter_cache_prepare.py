"""The serving cache merges a checkpoint ahead of its turn (AdapterCache.prepare), on the session's real vLLM
server: the later ensure() only loads the merged copy, and a name that comes to mean other weights is merged
anew. Merged mode only (the CPU build's default); a server with runtime adapters has nothing to prepare."""

import pytest

from artweb.testing.weights import make_adapter
from rollouts.inference.adapter_cache import AdapterCache


def _greedy(server, name: str) -> str:
    import httpx

    body = {
        "model": name,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    answer = httpx.post(f"{server.base_url}/chat/completions", headers=server.headers, json=body, timeout=300)
    return answer.json()["choices"][0]["message"]["content"]


def test_a_checkpoint_merged_ahead_is_only_loaded_in_its_turn(vllm_server, tmp_path):
    if not vllm_server.merged:
        pytest.skip("runtime adapters: nothing is merged")
    cache = AdapterCache(vllm_server, capacity=2)
    first, second = (str(make_adapter(tmp_path / n, seed=k, std=0.05)) for k, n in enumerate(["one", "two"]))
    cache.prepare("ahead@1", first)
    merged = vllm_server.work_dir / "serve-cache" / "ahead_1"
    assert (merged / "config.json").exists() and "ahead@1" not in vllm_server.adapters  # written, not loaded
    written = (merged / "model.safetensors").stat().st_mtime_ns
    assert cache.ensure("ahead@1", first) == "ahead@1"
    assert (merged / "model.safetensors").stat().st_mtime_ns == written  # loaded as prepared, not merged again
    answer = _greedy(vllm_server, "ahead@1")
    # The same name for other weights (another attempt's checkpoint): prepared anew, answered by those.
    cache.clear()
    vllm_server.ensure_base()
    cache.prepare("ahead@1", first)
    cache.prepare("ahead@1", second)
    assert (merged / ".adapter-path").read_text() == second
    cache.ensure("ahead@1", second)
    assert _greedy(vllm_server, "ahead@1") != answer
    cache.clear()
    vllm_server.ensure_base()
