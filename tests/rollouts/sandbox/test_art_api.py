"""ART 0.5.18's rollout-side API in the sandbox's `art`: every public name imports, and each helper behaves as
ART's does, or raises NotSupportedInSandbox naming what artweb cannot honour. In-process, no server, except
the last tests, which run scripts in the sandbox as the other sandbox tests do."""

import asyncio
import importlib
import json
import logging
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from openai.types.chat.chat_completion import ChatCompletion

from rollouts.sandbox.rollouts import run_rollouts
from tests.rollouts.sandbox.scripts import script

GUEST = Path(__file__).resolve().parents[3] / "rollouts" / "sandbox" / "guest"
if str(GUEST) not in sys.path:
    sys.path.insert(0, str(GUEST))

import art  # noqa: E402 - the sandbox's `art`, importable once the guest directory is on sys.path
from artweb_sdk.model import Endpoint  # noqa: E402

# ART 0.5.18's public rollout-side names, module by module: `art`'s __all__, and the submodules ART's
# scripts and guides import from.
ART_NAMES = {
    "art": [
        "dev", "auto_trajectory", "capture_auto_trajectory", "gather_trajectories", "gather_trajectory_groups",
        "trajectory_group_batches", "Backend", "LocalBackend", "LocalTrainResult", "ServerlessBackend",
        "ServerlessTrainResult", "Messages", "MessagesAndChoices", "Tools", "Model", "TrainableModel", "retry",
        "TrainSFTConfig", "TrainConfig", "TrainResult", "Trajectory", "TrajectoryGroup",
        "capture_yielded_trajectory", "yield_trajectory",
    ],
    "art.utils": [
        "format_message", "get_model_step", "iterate_dataset", "limit_concurrency", "log_http_errors",
        "record_provenance", "retry", "strip_logprobs",
    ],
    "art.utils.iterate_dataset": ["iterate_dataset", "DatasetBatch"],
    "art.utils.limit_concurrency": ["limit_concurrency"],
    "art.utils.strip_logprobs": ["strip_logprobs"],
    "art.utils.retry": ["retry"],
    "art.utils.format_message": ["format_message"],
    "art.utils.sft": ["create_sft_dataset_iterator", "train_sft_from_file"],
    "art.types": [
        "Choice", "Message", "MessageOrChoice", "Messages", "MessagesAndChoices", "Tools", "TrainConfig",
        "TrainSFTConfig", "Verbosity", "TrainResult", "LocalTrainResult", "ServerlessTrainResult",
    ],
    "art.dev": [
        "EngineArgs", "InternalModelConfig", "InitArgs", "PeftArgs", "TinkerArgs", "TinkerNativeArgs",
        "TinkerTrainingClientArgs", "TrainerArgs", "get_openai_server_config", "is_dedicated_mode",
        "OpenAIServerConfig", "ServerArgs", "TrainSFTConfig", "TrainConfig", "validate_dedicated_config",
    ],
    "art.trajectories": ["History", "Trajectory", "TrajectoryGroup"],
    "art.gather": ["gather_trajectories", "gather_trajectory_groups"],
    "art.batches": ["trajectory_group_batches"],
    "art.auto_trajectory": ["auto_trajectory", "capture_auto_trajectory"],
    "art.yield_trajectory": ["capture_yielded_trajectory", "yield_trajectory"],
    "art.rewards": ["ruler", "ruler_score_group"],
    "art.langgraph": ["init_chat_model", "wrap_rollout"],
    "art.mcp": [
        "GeneratedScenario", "GeneratedScenarioCollection", "MCPResource", "MCPTool", "complete_task_tool",
        "generate_scenarios",
    ],
    "art.local": ["LocalBackend"],
    "art.serverless": ["ServerlessBackend"],
    "art.serverless.backend": ["ServerlessBackend"],
    "art.backend": ["Backend"],
    "art.model": ["Model", "TrainableModel"],
}  # fmt: skip


def test_every_public_name_of_arts_rollout_api_imports_from_the_sandboxs_art():
    assert Path(art.__file__).parent == GUEST / "art"
    missing = []
    for module_name, names in ART_NAMES.items():
        module = importlib.import_module(module_name)
        missing += [f"{module_name}.{name}" for name in names if not hasattr(module, name)]
    assert missing == []
    # As in ART, the helpers' functions take their submodules' names.
    from art.utils.iterate_dataset import iterate_dataset
    from art.utils.retry import retry

    assert art.utils.retry is retry is art.retry and art.utils.iterate_dataset is iterate_dataset
    assert callable(art.auto_trajectory) and callable(art.yield_trajectory)


def test_import_art_leaves_the_openai_library_for_the_first_use_of_its_types():
    code = f"""import sys; sys.path.insert(0, {str(GUEST)!r})
import art
before = "openai" in sys.modules
print(before, art.Messages.__origin__ is list, "openai" in sys.modules)"""
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


# --- retry ---------------------------------------------------------------------------------------------


@pytest.fixture
def sleeps(monkeypatch):
    """The waits retry asks for, recorded instead of slept: asyncio.sleep and time.sleep replaced for the
    test (a fake, so that the backoff is exact and the test fast)."""
    waited = []

    async def fake_async_sleep(seconds):
        waited.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", fake_async_sleep)
    monkeypatch.setattr(time, "sleep", waited.append)
    return waited


def test_retry_calls_an_async_function_again_with_a_growing_delay(sleeps):
    calls, seen = [], []

    @art.retry(max_attempts=4, delay=0.5, backoff_factor=3, on_retry=lambda exc, n: seen.append((str(exc), n)))
    async def flaky(x):
        calls.append(x)
        if len(calls) < 3:
            raise ValueError(f"try {len(calls)}")
        return x * 2

    assert flaky.__name__ == "flaky"
    assert asyncio.run(flaky(21)) == 42
    assert calls == [21, 21, 21] and sleeps == [0.5, 1.5]
    assert seen == [("try 1", 1), ("try 2", 2)]


def test_retry_raises_the_last_failure_after_max_attempts_and_logs_each_retry(sleeps, caplog):
    calls = []

    @art.retry(max_attempts=3)
    def always_fails():
        calls.append(1)
        raise ConnectionError(f"down {len(calls)}")

    with caplog.at_level(logging.WARNING), pytest.raises(ConnectionError, match="down 3"):
        always_fails()
    assert len(calls) == 3 and sleeps == [0.25, 0.5]  # ART's defaults: 0.25 s, doubled
    assert ["Retry 1/3 for always_fails after error: down 1", "Retry 2/3 for always_fails after error: down 2"] == [
        r.getMessage() for r in caplog.records
    ]


def test_retry_lets_other_exceptions_through_at_once(sleeps):
    calls = []

    @art.retry(exceptions=(TimeoutError,))
    async def broken():
        calls.append(1)
        raise KeyError("no")

    with pytest.raises(KeyError):
        asyncio.run(broken())
    assert calls == [1] and sleeps == []


# --- art.utils -----------------------------------------------------------------------------------------


def test_iterate_dataset_walks_epochs_in_steps_shuffled_by_the_epoch_number():
    import random

    from art.utils import iterate_dataset

    random.seed(7)
    expected_next = random.random()
    random.seed(7)
    batches = list(iterate_dataset(list("abcde"), groups_per_step=2, num_epochs=2, use_tqdm=False))
    assert random.random() == expected_next  # the script's own random state is left alone
    assert [(b.step, b.epoch, b.epoch_step) for b in batches] == [
        (0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0), (4, 1, 1), (5, 1, 2),
    ]  # fmt: skip
    # Python's shuffle seeded with the epoch number, as ART's: epoch 0 is [2, 1, 0, 4, 3], epoch 1 [2, 3, 4, 0, 1].
    assert [b.items for b in batches] == [["c", "b"], ["a", "e"], ["d"], ["c", "d"], ["e", "a"], ["b"]]
    resumed = list(iterate_dataset(list("abcde"), groups_per_step=2, num_epochs=2, initial_step=4))
    assert [(b.step, b.items) for b in resumed] == [(4, ["e", "a"]), (5, ["b"])]
    assert list(iterate_dataset([], groups_per_step=3)) == []


def test_limit_concurrency_bounds_running_calls_per_key():
    from art.utils import limit_concurrency

    running, peak = {}, {}

    @limit_concurrency(2)
    async def two_at_a_time(i):
        return await track("all")

    @limit_concurrency(1, derive_key=lambda user, i: user)
    async def one_per_user(user, i):
        return await track(user)

    async def track(key):
        running[key] = running.get(key, 0) + 1
        peak[key] = max(peak.get(key, 0), running[key])
        await asyncio.sleep(0.01)
        running[key] -= 1
        return key

    async def main():
        await asyncio.gather(*(two_at_a_time(i) for i in range(6)))
        await asyncio.gather(*(one_per_user(user, i) for i in range(3) for user in ("alice", "bob")))

    asyncio.run(main())
    assert peak == {"all": 2, "alice": 1, "bob": 1}


def test_strip_logprobs_removes_them_at_every_depth_from_a_copy():
    from art.utils import strip_logprobs

    data = {"logprobs": [1], "choices": [{"logprobs": {"content": []}, "text": "x"}], "pair": ({"logprobs": 1},)}
    assert strip_logprobs(data) == {"choices": [{"text": "x"}], "pair": ({},)}
    assert "logprobs" in data and "logprobs" in data["choices"][0]
    completion = ChatCompletion.model_validate(COMPLETION)
    stripped = strip_logprobs(completion)
    assert stripped.choices[0].logprobs is None and stripped.choices[0].message.content == "hello"
    assert completion.choices[0].logprobs is not None


def test_format_message_and_log_http_errors():
    from art.utils import format_message, log_http_errors

    call = {"function": {"name": "lookup", "arguments": '{"q": 1}'}}
    assert format_message({"role": "assistant", "content": "", "tool_calls": [call]}) == 'Assistant:\nlookup({"q": 1})'
    assert format_message({"role": "user", "content": "hi"}) == "User:\nhi\n"

    @log_http_errors
    async def fails():
        request = httpx.Request("GET", "http://127.0.0.1:9/v1/x")
        response = httpx.Response(404, json={"detail": "no such run"}, request=request)
        response.raise_for_status()

    with pytest.raises(Exception, match=r"^\[HTTP 404\] http://127.0.0.1:9/v1/x no such run$"):
        asyncio.run(fails())


# --- trajectories and groups ---------------------------------------------------------------------------


def test_track_duration_adds_up_each_blocks_time_and_finish_sets_the_duration():
    trajectory = art.Trajectory(start_time=datetime.now() - timedelta(seconds=3))

    async def main():
        for _ in range(2):
            async with trajectory.track_duration("tool"):
                await asyncio.sleep(0.05)

    asyncio.run(main())
    assert 0.1 <= trajectory.metrics["tool_duration"] < 1.0
    assert trajectory.finish() is trajectory
    assert 3.0 <= trajectory.metrics["duration"] < 4.0


def test_a_group_keeps_its_metadata_metrics_logs_and_the_exceptions_it_was_given():
    failure = ValueError("lost")
    group = art.TrajectoryGroup(
        [art.Trajectory(reward=1.0), failure], metadata={"scenario": 3}, metrics={"difficulty": 0.5}, logs=["a"]
    )
    group.log("b")
    assert len(group) == 1 and group.exceptions == [failure]
    assert (group.metadata, group.metrics, group.logs) == ({"scenario": 3}, {"difficulty": 0.5}, ["a", "b"])
    with pytest.raises(TypeError, match="not str"):
        art.TrajectoryGroup(["not a trajectory"])


def test_additional_histories_are_kept_on_the_trajectory_and_recorded_by_its_record():
    trajectory = art.Trajectory(
        additional_histories=[{"messages_and_choices": [{"role": "user", "content": "x"}], "tools": None}]
    )
    [history] = trajectory.additional_histories
    assert isinstance(history, art.History) and history.messages() == [{"role": "user", "content": "x"}]
    assert trajectory.to_record()["additional_histories"] == [
        {"messages": [{"role": "user", "content": "x"}], "tools": None}
    ]


# --- gathering -----------------------------------------------------------------------------------------


async def rollout_with(reward):
    if isinstance(reward, Exception):
        raise reward
    return art.Trajectory(reward=reward)


def test_gather_takes_coroutines_that_build_groups_and_drops_the_ones_that_raise():
    async def group_for(rewards):
        if rewards is None:
            raise RuntimeError("scenario broken")
        return await art.TrajectoryGroup(rollout_with(r) for r in rewards)

    async def unawaited_group():
        return art.TrajectoryGroup([rollout_with(0.25)], metadata={"kind": "lazy"})

    async def main():
        groups = await art.gather_trajectory_groups(
            [group_for([1.0, 0.0]), group_for(None), unawaited_group()], pbar_desc="train", max_exceptions=1
        )
        assert [[t.reward for t in g] for g in groups] == [[1.0, 0.0], [0.25]]
        assert groups[1].metadata == {"kind": "lazy"}
        with pytest.raises(art.TooManyExceptions, match="2 of 2 rollouts raised"):
            await art.gather_trajectory_groups([group_for(None), group_for(None)], max_exceptions=1)

    asyncio.run(main())


def test_gather_counts_failures_inside_groups_against_a_share_of_all_rollouts():
    def groups(failures):
        return [art.TrajectoryGroup(rollout_with(ValueError() if i < failures else 1.0) for i in range(4))]

    async def main():
        [group] = await art.gather_trajectory_groups(groups(2), max_exceptions=0.5)
        assert len(group) == 2 and len(group.exceptions) == 2
        with pytest.raises(art.TooManyExceptions, match="3 of 4"):
            await art.gather_trajectory_groups(groups(3), max_exceptions=0.5)

    asyncio.run(main())


def test_gather_uses_what_after_each_returns():
    def groups():
        return [art.TrajectoryGroup([art.Trajectory(reward=r)]) for r in (0.0, 1.0, 2.0)]

    async def rescored(group):
        reward = group[0].reward
        if reward == 0.0:
            return None  # dropped
        if reward == 1.0:
            return art.TrajectoryGroup([art.Trajectory(reward=10.0)])  # replaced
        return [group, group]  # expanded

    async def main():
        result = await art.gather_trajectory_groups(groups(), after_each=rescored)
        assert [g[0].reward for g in result] == [10.0, 2.0, 2.0]
        assert len(await art.gather_trajectory_groups(groups(), after_each=lambda g: g)) == 3  # a plain function
        with pytest.raises(TypeError, match="after_each must return.*returned float"):
            await art.gather_trajectory_groups(groups(), after_each=lambda g: 1.5)

    asyncio.run(main())


def test_gather_trajectories_keeps_order_and_failures_within_max_exceptions():
    async def several():
        return [art.Trajectory(reward=5.0), art.Trajectory(reward=6.0)]

    async def main():
        failure = ValueError("x")
        result = await art.gather_trajectories([rollout_with(1.0), rollout_with(failure), several()], max_exceptions=1)
        assert result[0].reward == 1.0 and result[1] is failure and [t.reward for t in result[2]] == [5.0, 6.0]
        with pytest.raises(art.TooManyExceptions):
            await art.gather_trajectories([rollout_with(failure)])

    asyncio.run(main())


def test_trajectory_group_batches_yields_finished_groups_in_batches_with_bounded_concurrency():
    running, peak = [0], [0]

    async def group(i):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.02 * i)  # groups finish in their order
        running[0] -= 1
        return art.TrajectoryGroup([art.Trajectory(reward=float(i))])

    async def batches(**kwargs):
        return [
            sorted(g[0].reward for g in batch)
            async for batch in art.trajectory_group_batches([group(i) for i in range(5)], batch_size=2, **kwargs)
        ]

    assert asyncio.run(batches(max_concurrent_batches=1)) == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    assert peak[0] == 2
    peak[0] = 0
    assert asyncio.run(batches(skip_batches=1)) == [[2.0, 3.0], [4.0]]
    assert peak[0] == 3  # all three at once under the default bound


# --- capturing trajectories ----------------------------------------------------------------------------

COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "run-1@2",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "token_ids": [7, 8],
            "message": {"role": "assistant", "content": "hello"},
            "logprobs": {"content": [{"token": "h", "logprob": -0.5, "bytes": None, "top_logprobs": []}]},
        }
    ],
}


async def serve_completions(seen: list):
    """An OpenAI-compatible server on 127.0.0.1 that answers each chat completion with COMPLETION, its
    content numbered by the request; the bodies go to `seen`."""

    async def answer(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        seen.append(json.loads(await reader.readexactly(length)))
        completion = json.loads(json.dumps(COMPLETION))
        completion["choices"][0]["message"]["content"] = f"answer {len(seen)}"
        body = json.dumps(completion)
        writer.write(
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n{body}".encode()
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def test_capture_auto_trajectory_records_every_clients_chat_completions():
    from openai import AsyncOpenAI

    async def main():
        seen = []
        server, base_url = await serve_completions(seen)
        model = art.TrainableModel(name="run-1@2", _endpoint=Endpoint(base_url=base_url))
        own_client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)  # the script's own client
        assert art.auto_trajectory() is None

        async def agent():
            messages = [{"role": "system", "content": "play"}, {"role": "user", "content": "go"}]
            first = await model.openai_client().chat.completions.create(model=model.name, messages=messages)
            art.auto_trajectory(required=True).reward = 0.5
            messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "again"}]
            await own_client.chat.completions.create(model=model.name, messages=messages)
            await own_client.chat.completions.create(model=model.name, messages=[{"role": "user", "content": "aside"}])

        async with server:
            trajectory = await art.capture_auto_trajectory(agent())
        return trajectory, seen

    trajectory, seen = asyncio.run(main())
    assert len(seen) == 3 and trajectory.reward == 0.5 and "duration" in trajectory.metrics
    assert [m["content"] for m in trajectory.messages()] == ["play", "go", "answer 1", "again", "answer 2"]
    assert trajectory.messages_and_choices[2].model_extra["token_ids"] == [7, 8]  # a Choice, trainable
    [aside] = trajectory.additional_histories  # a conversation that does not continue the first
    assert [m["content"] for m in aside.messages()] == ["aside", "answer 3"]
    with pytest.raises(RuntimeError, match="capture_auto_trajectory"):
        art.auto_trajectory(required=True)


def test_capture_refuses_a_streamed_completion_and_wrap_rollout_fills_the_returned_trajectory():
    async def main():
        seen = []
        server, base_url = await serve_completions(seen)
        model = art.TrainableModel(name="run-1@2", _endpoint=Endpoint(base_url=base_url))

        async def streamed(swallow):
            try:
                await model.openai_client().chat.completions.create(model=model.name, messages=[], stream=True)
            except Exception:
                if not swallow:
                    raise

        async def agent(prompt):
            await model.openai_client().chat.completions.create(
                model=model.name, messages=[{"role": "user", "content": prompt}]
            )
            return art.Trajectory(reward=1.0)

        async with server:
            for swallow in (False, True):  # a script that catches the error still learns it when the capture ends
                with pytest.raises(art.NotSupportedInSandbox, match="streamed chat completion"):
                    await art.capture_auto_trajectory(streamed(swallow))
            return await art.langgraph.wrap_rollout(model, agent)("hi"), seen

    trajectory, seen = asyncio.run(main())
    assert len(seen) == 1 and trajectory.reward == 1.0
    assert [m["content"] for m in trajectory.messages()] == ["hi", "answer 1"]


def test_a_ruler_judgement_inside_a_capture_is_not_recorded(monkeypatch):
    from tests.rollouts.sandbox.fake_judge import FakeJudge

    async def agent():
        trajectory = art.auto_trajectory(required=True)
        trajectory.messages_and_choices.append({"role": "user", "content": "mine"})
        [score] = await art.rewards.ruler([trajectory.messages()])
        trajectory.reward = score.score

    with FakeJudge([0.75]) as judge:
        monkeypatch.setenv("OPENAI_BASE_URL", judge.base_url)
        monkeypatch.setenv("ARTWEB_JUDGE_MODEL", "judge-model")
        trajectory = asyncio.run(art.capture_auto_trajectory(agent()))
    assert len(judge.requests) == 1 and trajectory.reward == 0.75
    assert trajectory.messages() == [{"role": "user", "content": "mine"}] and trajectory.additional_histories == []


def test_capture_yielded_trajectory_returns_the_one_handed_to_yield_trajectory(caplog):
    async def agent(reward):
        if reward is not None:
            art.yield_trajectory(art.Trajectory(reward=reward))

    async def main():
        assert (await art.capture_yielded_trajectory(agent(0.75))).reward == 0.75
        with pytest.raises(RuntimeError, match="No trajectory yielded"):
            await art.capture_yielded_trajectory(agent(None))

    asyncio.run(main())
    with caplog.at_level(logging.WARNING):
        art.yield_trajectory(art.Trajectory())  # outside a capture: said in the log, as nothing receives it
    assert "outside capture_yielded_trajectory" in caplog.text


# --- the model, and what the sandbox cannot honour ----------------------------------------------------


def test_get_inference_name_serves_only_the_batchs_checkpoint():
    model = art.TrainableModel(name="run-7@3", _endpoint=Endpoint(base_url="http://127.0.0.1:9/v1"))
    assert model.get_inference_name() == model.get_inference_name(step=3) == "run-7@3"
    assert model.litellm_completion_params(step=3)["model"] == "hosted_vllm/run-7@3"
    with pytest.raises(art.NotSupportedInSandbox, match=r"get_inference_name\(step=2\).*'run-7@3'"):
        model.get_inference_name(step=2)
    base = art.TrainableModel(name="Qwen/Qwen3-0.6B", _endpoint=Endpoint(base_url="http://127.0.0.1:9/v1"))
    assert base.get_inference_name(step=0) == "Qwen/Qwen3-0.6B"


def test_configs_and_results_are_kept_as_given():
    config = art.dev.InternalModelConfig(engine_args=art.dev.EngineArgs(gpu_memory_utilization=0.5))
    assert config == {"engine_args": {"gpu_memory_utilization": 0.5}}
    assert art.dev.is_dedicated_mode({"trainer_gpu_ids": [0], "inference_gpu_ids": [1]})
    assert not art.dev.is_dedicated_mode(config)
    assert art.TrainSFTConfig(batch_size=4).batch_size == 4 and art.TrainConfig().learning_rate == 5e-6
    assert art.LocalTrainResult(step=3, checkpoint_path="/c").metrics == {}
    tool = art.mcp.MCPTool.from_dict({"name": "find", "description": "d", "parameters": {"type": "object"}})
    assert tool.to_tool_schema() == {"type": "function", "function": tool.to_dict()}
    scenarios = art.mcp.GeneratedScenarioCollection.from_json(
        '[{"task": "a", "difficulty": 1}, {"task": "bb", "difficulty": 4}]'
    )
    train, val = scenarios.split(1)
    assert [s.task for s in train] == ["a"] and [s.task for s in val] == ["bb"]
    assert len(scenarios.filter_by_difficulty(min_difficulty=2)) == 1
    assert scenarios.get_summary()["avg_task_length"] == 1.5


def unsupported_calls():
    model = art.TrainableModel(name="run-1@1", _endpoint=Endpoint(base_url="http://127.0.0.1:9/v1"))
    return {
        "model.train(...)": lambda: asyncio.run(model.train([])),
        "model.train_sft(...)": lambda: asyncio.run(model.train_sft([])),
        "backend.train(...)": lambda: asyncio.run(art.LocalBackend().train(model, [])),
        "model.write_state(...)": lambda: model.write_state({"k": 1}),
        "art.utils.sft.train_sft_from_file": lambda: asyncio.run(art.utils.sft.train_sft_from_file("f.jsonl")),
        "art.utils.get_model_step": lambda: art.utils.get_model_step(model, ".art"),
        "art.utils.record_provenance": lambda: art.utils.record_provenance(None, "x"),
        "art.dev.get_openai_server_config": lambda: art.dev.get_openai_server_config("m", "b", "log"),
        "art.mcp.generate_scenarios": lambda: asyncio.run(art.mcp.generate_scenarios([tool_dict()])),
    }


def tool_dict():
    return {"name": "t", "description": "", "parameters": {}}


@pytest.mark.parametrize("feature", list(unsupported_calls()))
def test_what_the_sandbox_cannot_honour_raises_naming_it(feature):
    with pytest.raises(art.NotSupportedInSandbox) as raised:
        unsupported_calls()[feature]()
    assert str(raised.value).startswith(f"{feature} is not available in artweb's sandbox: ")


def test_langgraphs_chat_model_needs_a_wrapped_rollout_and_langchain():
    model = art.TrainableModel(name="run-1@1", _endpoint=Endpoint(base_url="http://127.0.0.1:9/v1"))
    with pytest.raises(RuntimeError, match="inside a rollout wrapped with art.langgraph.wrap_rollout"):
        art.langgraph.init_chat_model()
    if importlib.util.find_spec("langchain_openai") is not None:
        pytest.skip("langchain-openai is installed here: the missing-package message cannot be seen")

    async def agent():
        art.langgraph.init_chat_model()

    with pytest.raises(ImportError, match="needs the packages langchain-openai"):
        asyncio.run(art.langgraph.wrap_rollout(model, agent)())


# --- in the sandbox ------------------------------------------------------------------------------------

RETRYING_SCRIPT = """
import art
from art.utils import iterate_dataset

STEPS = [batch.items for batch in iterate_dataset(list(range(5)), groups_per_step=2)]


@art.retry(max_attempts=3, delay=0.01, exceptions=(ValueError,))
async def rollout(model, scenario):
    scenario["tries"] = scenario.get("tries", 0) + 1
    if scenario.tries < 2:
        raise ValueError("first try fails")
    return art.Trajectory(reward=1.0, metadata={"tries": scenario.tries, "steps": STEPS})
"""


def test_a_script_retries_its_rollout_with_art_retry_and_walks_a_dataset(request_for):
    results = run_rollouts(request_for(RETRYING_SCRIPT))
    trajectories = [t for group in results for t in group.trajectories]
    assert len(trajectories) == 4
    for t in trajectories:
        assert t["error"] is None and t["reward"] == 1.0
        assert t["metadata"] == {"tries": 2, "steps": [[2, 1], [0, 4], [3]]}
        assert any("Retry 1/3 for rollout after error: first try fails" in line for line in t["logs"])


def test_a_trajectory_that_cannot_be_recorded_fails_its_own_rollout_only(request_for):
    history = 'art.History([{"role": "user", "content": "x"}, 42])'
    for bad, needle in (
        (f"return art.Trajectory(reward=1.0, additional_histories=[{history}])", "The trajectory is not JSON"),
        ("return art.Trajectory(messages_and_choices=[42], reward=1.0)", "The trajectory is not JSON"),
    ):
        bad_group, good_group = run_rollouts(request_for(script(f'print("before")\n{bad}')))
        assert [t["reward"] for t in good_group.trajectories] == [1.0, 1.0]
        for t in bad_group.trajectories:
            assert t["reward"] is None and t["error"].startswith(needle) and t["logs"] == ["before"], t
