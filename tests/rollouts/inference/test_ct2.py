"""artweb's CTranslate2 server (the CPU inference path for processors without bf16 units) against the
default model: what the trainer relies on (log-probs, token ids, finish reasons), the OpenAI features
rollouts and serving use, its key, and how a worker picks it. The interface it shares with vLLM (rollouts,
tools, adapters, restarts) is tested against both servers in test_vllm.py."""

import json
import os
from pathlib import Path

import httpx
import pytest

from rollouts.inference import cpu_probe
from rollouts.inference.ct2_openai import settled_text

QUESTION = [{"role": "user", "content": "Name three fruits."}]


def _chat(server, **body):
    # The base model unless the test names another (asking for the base would load its weights back).
    body = {"messages": QUESTION, "max_tokens": 16, **body}
    if body.get("model") is None:
        body["model"] = server.ensure_base()
    return httpx.post(f"{server.base_url}/chat/completions", json=body, headers=server.headers, timeout=300)


def test_its_logprobs_are_the_models_own_before_temperature(ct2_server, vllm_model_dir):
    """Checked against transformers in float32: the trainer's importance ratios take these as the
    sampler's log-probs, and vLLM reports them before temperature too."""
    import torch
    import transformers

    answer = _chat(ct2_server, temperature=0.5, logprobs=True, return_token_ids=True)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    [choice] = data["choices"]
    ids, logprobs = choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]
    assert len(ids) == len(logprobs) == data["usage"]["completion_tokens"] > 0
    prompt = data["prompt_token_ids"]

    model = transformers.AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    raw = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    scaled = torch.log_softmax(logits / 0.5, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(logprobs), raw, atol=2e-3)
    assert not torch.allclose(torch.tensor(logprobs), scaled, atol=2e-3)


def test_rows_that_share_a_start_get_the_logprobs_of_their_own_whole_prompt(ct2_server, vllm_model_dir):
    """A batch runs the start its rows share once (CTranslate2's static prompt): here a system prompt
    for two requests sent together, and each request's whole prompt but its last token for its n rows.
    Every sample must still be scored as if its prompt had run alone."""
    import threading

    import torch
    import transformers

    system = {"role": "system", "content": "You answer in one short sentence."}
    questions = ["Name three fruits.", "What colour is the sky?"]
    answers: dict[str, dict] = {}

    def ask(question: str) -> None:
        messages = [system, {"role": "user", "content": question}]
        answers[question] = _chat(
            ct2_server, messages=messages, n=3, temperature=1.0, max_tokens=12, logprobs=True, return_token_ids=True
        ).json()

    ct2_server.ensure_base()
    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    model = transformers.AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32)
    assert all("prompt_token_ids" in a for a in answers.values()), answers
    prompts = [answers[q]["prompt_token_ids"] for q in questions]
    assert prompts[0][:5] == prompts[1][:5] and prompts[0] != prompts[1]  # a shared start, then their own
    for question in questions:
        data = answers[question]
        assert len(data["choices"]) == 3, data
        prompt = data["prompt_token_ids"]
        for choice in data["choices"]:
            ids, logprobs = choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]
            with torch.no_grad():
                logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
            expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(logprobs), expected, atol=2e-3), question


def test_the_shared_start_leaves_every_row_a_token_of_its_own():
    from rollouts.inference.ct2_engine import _shared_prefix

    assert _shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert _shared_prefix([[1, 2, 3], [1, 2, 3]]) == 2  # identical prompts: each keeps its last token
    assert _shared_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2
    assert _shared_prefix([[7, 2], [1, 2]]) == 0
    assert _shared_prefix([[1, 2, 3]]) == 0  # one row: nothing to share


def test_an_answer_that_ends_keeps_its_end_token_and_one_cut_short_says_length(ct2_server):
    tokenizer_eos = 2  # SmolLM2's <|im_end|>
    ended = _chat(ct2_server, temperature=0, max_tokens=200, return_token_ids=True).json()["choices"][0]
    assert ended["finish_reason"] == "stop" and ended["token_ids"][-1] == tokenizer_eos
    assert "<|im_end|>" not in ended["message"]["content"]
    cut = _chat(ct2_server, temperature=0, max_tokens=3, return_token_ids=True).json()["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["token_ids"]) == 3
    assert ended["token_ids"][:3] == cut["token_ids"]  # greedy: the same start


def test_a_stop_string_ends_the_answer_before_it(ct2_server):
    full = _chat(ct2_server, temperature=0, max_tokens=40).json()["choices"][0]["message"]["content"]
    stop = full.split()[2]
    cut = _chat(ct2_server, temperature=0, max_tokens=40, stop=[stop]).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and stop not in cut["message"]["content"]
    assert full.startswith(cut["message"]["content"])


def test_a_streamed_answer_is_the_answer(ct2_server):
    plain = _chat(ct2_server, temperature=0, max_tokens=24, return_token_ids=True, logprobs=True).json()["choices"][0]
    body = {
        "model": ct2_server.ensure_base(),
        "messages": QUESTION,
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "logprobs": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    chunks = []
    with httpx.stream(
        "POST", f"{ct2_server.base_url}/chat/completions", json=body, headers=ct2_server.headers, timeout=300
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert len(deltas) > 3  # sent as it was sampled, not in one piece
    assert "".join(d["delta"].get("content") or "" for d in deltas) == plain["message"]["content"]
    assert [t for d in deltas for t in d.get("token_ids") or []] == plain["token_ids"]
    streamed_logprobs = [e["logprob"] for d in deltas for e in (d["logprobs"] or {}).get("content", [])]
    assert streamed_logprobs == pytest.approx([e["logprob"] for e in plain["logprobs"]["content"]], abs=1e-4)
    assert deltas[-1]["finish_reason"] == plain["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == len(plain["token_ids"])


def test_samples_of_one_seed_repeat_and_n_gives_n(ct2_server):
    one = _chat(ct2_server, temperature=1.0, seed=11, n=3, max_tokens=12).json()["choices"]
    again = _chat(ct2_server, temperature=1.0, seed=11, n=3, max_tokens=12).json()["choices"]
    assert len(one) == 3 and [c["message"]["content"] for c in one] == [c["message"]["content"] for c in again]
    assert len({c["message"]["content"] for c in one}) > 1  # three samples, not one repeated


def test_top_logprobs_rank_the_alternatives(ct2_server):
    [choice] = _chat(ct2_server, temperature=1.0, logprobs=True, top_logprobs=3, max_tokens=6).json()["choices"]
    for entry in choice["logprobs"]["content"]:
        top = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(top) == 3 and top == sorted(top, reverse=True)
        assert entry["logprob"] <= top[0] + 1e-4


def test_each_row_of_a_batch_gets_its_own_top_logprobs(ct2_server):
    """Several rows in one batch (n > 1, as the playground asks): CTranslate2 hands a step's logits for all
    rows to one row's callback and an empty view to the others'; every answer failed with "generation
    failed: float() argument must be ... not 'ctranslate2._ext.StorageView'". Each row's top log-probs are
    its own: the token it sampled, where among its top ones, has the log-prob reported for it."""
    # No seed: a seeded request is sampled on its own path (transformers), not in a CTranslate2 batch.
    answer = _chat(ct2_server, temperature=1.0, n=3, max_tokens=10, logprobs=True, top_logprobs=5)
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert len(choices) == 3 and len({c["message"]["content"] for c in choices}) > 1
    found = 0
    for choice in choices:
        for entry in choice["logprobs"]["content"]:
            top = {t["token"]: t["logprob"] for t in entry["top_logprobs"]}
            assert len(top) == 5 and entry["logprob"] <= max(top.values()) + 1e-3
            if entry["token"] in top:
                found += 1
                assert entry["logprob"] == pytest.approx(top[entry["token"]], abs=1e-3)
    assert found >= 10  # most sampled tokens are among their row's five likeliest


def test_a_named_tool_choice_answers_with_that_call(ct2_server):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_capital",
                "parameters": {"type": "object", "properties": {"country": {"type": "string"}}},
            },
        }
    ]
    [choice] = _chat(
        ct2_server,
        messages=[{"role": "user", "content": "What is the capital of Peru?"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "lookup_capital"}},
        temperature=0,
        max_tokens=40,
        return_token_ids=True,
        logprobs=True,
    ).json()["choices"]
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup_capital" and isinstance(json.loads(call["function"]["arguments"]), dict)
    # The call's opening was forced, and is part of the trained answer with the model's own log-probs.
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"])
    assert all(e["logprob"] <= 0 for e in choice["logprobs"]["content"])
    unknown = _chat(ct2_server, tools=tools, tool_choice={"type": "function", "function": {"name": "other"}})
    assert unknown.status_code == 400 and "other" in unknown.json()["error"]["message"]


def test_bad_requests_say_what_to_fix(ct2_server):
    missing = _chat(ct2_server, model="run-9@9")
    assert missing.status_code == 404 and "run-9@9" in missing.json()["error"]["message"]
    too_long = _chat(ct2_server, max_tokens=5000)
    assert too_long.status_code == 400 and "maximum context length is 2048" in too_long.json()["error"]["message"]
    bad = (
        ("temperature", -1),
        ("n", 0),
        ("top_p", 2),
        ("stop", [3]),
        ("messages", "hi"),
        ("response_format", {"type": "yaml"}),
        ("chat_template_kwargs", {"tokenize": False}),  # the server's own arguments stay its own
    )
    for field, value in bad:
        answer = _chat(ct2_server, **{field: value})
        assert answer.status_code == 400 and field in answer.json()["error"]["message"], (field, answer.text)


def test_every_route_but_health_needs_its_key(ct2_server):
    root = ct2_server.root_url
    routes = [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/artweb/load"),
        ("GET", "/docs"),
        ("OPTIONS", "/v1/chat/completions"),
    ]
    with httpx.Client(base_url=root, timeout=30) as client:
        for method, path in routes:
            for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": ct2_server.api_key}):
                assert client.request(method, path, headers=headers).status_code == 401, (method, path, headers)
        assert client.get("/health").status_code == 200
        assert client.get("/v1/models", headers=ct2_server.headers).json()["data"][0]["id"] == ct2_server.ensure_base()
    assert ct2_server.api_key not in " ".join(ct2_server.command())


def test_a_text_completion_answers_too(ct2_server):
    body = {"model": ct2_server.ensure_base(), "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0}
    answer = httpx.post(f"{ct2_server.base_url}/completions", json=body, headers=ct2_server.headers, timeout=120)
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"]


def test_text_waiting_for_a_stop_string_or_a_character_is_held_back():
    assert settled_text("Hello wor", ["world!"]) == "Hello "
    assert settled_text("caf\ufffd", []) == "caf"
    assert settled_text("plain", ["xyz"]) == "plain"


# --- which server a worker starts ----------------------------------------------------------------------


def test_the_probe_picks_a_server_by_the_speed_of_each_dtype(monkeypatch, tmp_path):
    calls = []

    def fake_gflops(dtype, seconds=0.25):
        calls.append(str(dtype))
        return {"torch.bfloat16": 5.0, "torch.float32": 20.0}[str(dtype)]

    monkeypatch.setattr(cpu_probe, "_gflops", fake_gflops)
    choice = cpu_probe.choose("auto", cache_file=tmp_path / "probe.json")
    assert choice.engine == "ctranslate2" and "bf16 5.0" in choice.reason
    assert cpu_probe.choose("auto", cache_file=tmp_path / "probe.json") == choice
    assert len(calls) == 2  # measured once, then read from the file

    monkeypatch.setattr(cpu_probe, "_gflops", lambda dtype, seconds=0.25: 60.0 if "bfloat16" in str(dtype) else 20.0)
    assert cpu_probe.choose("auto", cache_file=tmp_path / "other.json").engine == "vllm"
    assert cpu_probe.choose("vllm", cache_file=None).engine == "vllm"
    with pytest.raises(ValueError, match="one of auto, vllm, ctranslate2"):
        cpu_probe.choose("llama", cache_file=None)


def test_the_real_probe_measures_both_dtypes():
    choice = cpu_probe.measure()
    assert choice.bf16_gflops > 0 and choice.fp32_gflops > 0
    assert choice.engine == ("vllm" if choice.bf16_gflops > choice.fp32_gflops else "ctranslate2")


def test_an_adapter_folded_in_by_the_server_answers_as_its_merged_copy(ct2_server, tmp_path):
    """The server folds a step's adapter into the base weights itself (float32, in memory); the merged
    copy other servers load (rollouts.inference.merge, bf16) gives the same greedy answer, within bf16's
    rounding of the log-probs."""
    from artweb.testing.weights import make_adapter
    from rollouts.inference.merge import merge_adapter

    adapter = make_adapter(tmp_path / "step1", seed=1, std=0.05)
    folded = _chat(
        ct2_server,
        model=ct2_server.ensure_adapter("run-7@1", str(adapter)),
        temperature=0,
        max_tokens=4,
        logprobs=True,
        return_token_ids=True,
    )
    merged_dir = merge_adapter(ct2_server.model_path, adapter, tmp_path / "merged")
    copied = _chat(
        ct2_server,
        model=ct2_server.load_merged("run-7@1-merged", str(adapter), str(merged_dir)),
        temperature=0,
        max_tokens=4,
        logprobs=True,
        return_token_ids=True,
    )
    one, other = folded.json()["choices"][0], copied.json()["choices"][0]
    assert one["token_ids"] == other["token_ids"]
    assert [e["logprob"] for e in one["logprobs"]["content"]] == pytest.approx(
        [e["logprob"] for e in other["logprobs"]["content"]], abs=0.05
    )
    bad = httpx.post(
        f"{ct2_server.root_url}/artweb/load",
        json={"name": "x", "adapter_dir": str(tmp_path)},
        headers=ct2_server.headers,
        timeout=60,
    )
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    ct2_server.ensure_base()


def test_after_a_load_both_of_its_generators_serve_the_new_policy(ct2_server, tmp_path):
    """A load converts the policy for CTranslate2 from the model the server keeps in memory, which also answers
    what CTranslate2 cannot (a seeded request, here): greedy answers from both agree after the load, so the
    conversion left that model's weights as they were, and both differ from the base model's."""
    from artweb.testing.weights import make_adapter

    def greedy(model: str, **extra) -> tuple[list[int], list[float]]:
        body = dict(model=model, temperature=0, max_tokens=6, logprobs=True, return_token_ids=True, **extra)
        choice = _chat(ct2_server, **body).json()["choices"][0]
        return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]

    base = greedy(ct2_server.ensure_base())
    name = ct2_server.ensure_adapter("run-8@1", str(make_adapter(tmp_path / "step1", seed=3, std=0.08)))
    batched, seeded = greedy(name), greedy(name, seed=11)
    assert batched[0] == seeded[0]
    assert batched[1] == pytest.approx(seeded[1], abs=0.02)
    assert not (batched[0] == base[0] and batched[1] == pytest.approx(base[1], abs=0.01))  # the adapter moved it
    ct2_server.ensure_base()


def test_a_policy_is_written_as_ctranslate2_writes_it_into_the_same_file(ct2_server, tmp_path):
    """Each load after the first writes the weights with write_model_bin, not CTranslate2's own writer
    (1-2 s for this model against 0.1-0.2 s): both give the same bytes for the same model. Loads rewrite
    one file in place, so its pages are reused. That file has no name: only the server holds it open, so a
    server killed without its stop() leaves no copy of the weights behind."""
    import ctranslate2
    import torch
    import transformers

    from artweb.testing.weights import make_adapter
    from rollouts.inference.ct2_convert import convert, write_model_bin

    model = transformers.AutoModelForCausalLM.from_pretrained(ct2_server.model_path, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(ct2_server.model_path)
    spec = convert(model, tokenizer, "float32")
    spec.save(str(tmp_path))
    with open(tmp_path / "mine.bin", "wb") as fh:
        write_model_bin(spec, fh)
    assert (tmp_path / "mine.bin").read_bytes() == (tmp_path / "model.bin").read_bytes()
    (tmp_path / "model.bin").replace(tmp_path / "ctranslate2.bin")
    (tmp_path / "mine.bin").replace(tmp_path / "model.bin")
    generator = ctranslate2.Generator(str(tmp_path), compute_type="float32")
    prompt = tokenizer.convert_ids_to_tokens(tokenizer("The capital of France is")["input_ids"])
    answer = generator.generate_batch([prompt], max_length=4, sampling_topk=1, include_prompt_in_result=False)
    assert len(answer[0].sequences_ids[0]) == 4

    policy = ct2_server.work_dir / "engine" / "policy"
    before = _chat(ct2_server, temperature=0, max_tokens=6, return_token_ids=True).json()["choices"][0]["token_ids"]
    link = os.readlink(policy / "model.bin")
    assert link.startswith("/proc/self/fd/")
    held = Path(f"/proc/{ct2_server._proc.pid}/fd/{link.rsplit('/', 1)[1]}")  # the server's descriptor
    inode = held.stat().st_ino
    ct2_server.ensure_adapter("run-9@1", str(make_adapter(tmp_path / "step1", seed=5, std=0.08)))
    ct2_server.ensure_base()
    after = _chat(ct2_server, temperature=0, max_tokens=6, return_token_ids=True).json()["choices"][0]["token_ids"]
    assert after == before  # the base weights written back by write_model_bin answer as the first load's
    assert sorted(p.name for p in policy.iterdir()) == ["config.json", "model.bin", "vocabulary.json"]
    assert os.readlink(policy / "model.bin") == link
    assert held.stat().st_ino == inode and held.stat().st_nlink == 0  # the same file, and no name of its own
    assert held.stat().st_size > 100 * 2**20  # the weights are in it
    assert sum(p.lstat().st_size for p in policy.iterdir()) < 2 * 2**20  # and not in the directory


def test_weights_that_do_not_fit_are_refused_before_the_served_policy_changes(ct2_server, tmp_path):
    """A load writes the weights into the served model one at a time, so everything is checked first: a
    checkpoint lacking weights, one of another shape, an adapter for layers this model has not. Each is
    refused with what is wrong, and the policy served before answers as it did."""
    import torch
    from safetensors.torch import load_file, save_file

    def greedy() -> list[int]:
        return _chat(ct2_server, temperature=0, max_tokens=6, return_token_ids=True).json()["choices"][0]["token_ids"]

    def load(**body) -> httpx.Response:
        return httpx.post(
            f"{ct2_server.root_url}/artweb/load", json={"name": "bad", **body}, headers=ct2_server.headers, timeout=120
        )

    before = greedy()
    weights = load_file(str(next(Path(ct2_server.model_path).glob("*.safetensors"))))
    (tmp_path / "partial").mkdir()
    save_file({"model.norm.weight": weights["model.norm.weight"]}, str(tmp_path / "partial" / "model.safetensors"))
    refused = load(weights_dir=str(tmp_path / "partial"))
    assert refused.status_code == 400 and "lacks" in refused.json()["error"]["message"]

    (tmp_path / "reshaped").mkdir()
    save_file({**weights, "model.norm.weight": torch.ones(7)}, str(tmp_path / "reshaped" / "model.safetensors"))
    refused = load(weights_dir=str(tmp_path / "reshaped"))
    assert refused.status_code == 400
    assert "model.norm.weight has shape (7,)" in refused.json()["error"]["message"]

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    save_file(
        {
            "base_model.model.model.layers.99.mlp.up_proj.lora_A.weight": torch.zeros(2, 576),
            "base_model.model.model.layers.99.mlp.up_proj.lora_B.weight": torch.zeros(1536, 2),
        },
        str(tmp_path / "other" / "adapter_model.safetensors"),
    )
    refused = load(adapter_dir=str(tmp_path / "other"))
    assert refused.status_code == 400 and "layers.99.mlp.up_proj" in refused.json()["error"]["message"]
    assert greedy() == before


def test_top_logprobs_read_logits_in_any_compute_type():
    """Seen through the playground (which always asks for top log-probs): with a bfloat16 compute type the
    step's logits are a bfloat16 StorageView, which numpy cannot read, and every answer failed with
    "generation failed: float() argument must be ... not 'ctranslate2._ext.StorageView'"."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    import numpy as np

    from rollouts.inference.ct2_engine import _top

    logits = ctranslate2.StorageView.from_array(np.array([[0.0, 1.0, 2.0, 3.0]], dtype=np.float32))
    want = _top(logits, 2)
    assert [i for i, _ in want] == [3, 2] and want[0][1] == pytest.approx(-0.4402, abs=1e-3)
    for dtype in (ctranslate2.DataType.bfloat16, ctranslate2.DataType.float16):
        got = _top(logits.to(dtype), 2)
        assert [i for i, _ in got] == [3, 2] and got[0][1] == pytest.approx(want[0][1], abs=1e-2)
