"""What an ART client posts (training.client_runs.wire): bodies shaped as ART 0.5.18's
`TrajectoryGroup.model_dump(mode="json")` converted into artweb's records, and every refusal naming where."""

from __future__ import annotations

import copy

import pytest

from training.client_runs.wire import MAX_GROUPS, WireError, parse_model_create, parse_training_job

VOCAB = 49152  # the default model's vocabulary
MB4 = 4 << 20


def choice(content: str, ids=None, logprobs=None, *, as_tokens: bool = False, finish_reason: str = "stop") -> dict:
    """An OpenAI Choice as ART dumps it: `token_ids` from vLLM's return_token_ids, or (as_tokens) the ids
    only in the logprobs' `token_id:<n>` tokens, as vLLM writes them with return_tokens_as_token_ids."""
    out = {
        "finish_reason": finish_reason,
        "index": 0,
        "logprobs": None,
        "message": {"content": content, "refusal": None, "role": "assistant", "tool_calls": None},
    }
    if logprobs is not None:
        tokens = [f"token_id:{t}" if as_tokens else f"t{t}" for t in ids or [0] * len(logprobs)]
        out["logprobs"] = {
            "content": [
                {"token": tok, "bytes": None, "logprob": lp, "top_logprobs": []}
                for tok, lp in zip(tokens, logprobs, strict=False)  # a short list: as many entries as logprobs
            ],
            "refusal": None,
        }
    if ids is not None and not as_tokens:
        out["token_ids"] = ids
    return out


def trajectory(reward, answer=None, *, metadata=None, prompt="2+2?") -> dict:
    answer = answer if answer is not None else choice("4", [19, 2], [-0.5, -0.25])
    return {
        "messages_and_choices": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": prompt, "token_ids": [7, 8]},  # a plain message's ids are never kept
            answer,
        ],
        "tools": None,
        "additional_histories": [],
        "reward": reward,
        "initial_policy_version": None,
        "final_policy_version": None,
        "metrics": {"duration": 0.25},
        "metadata": metadata or {},
        "logs": [],
    }


def group(*rewards, metadata=None, **kwargs) -> dict:
    return {
        "trajectories": [trajectory(r, **kwargs) for r in rewards],
        "exceptions": [],
        "metadata": metadata or {},
        "metrics": {},
        "logs": [],
    }


def body(*groups, config=None) -> dict:
    return {
        "model_id": "7",
        "trajectory_groups": list(groups or [group(1.0, 0.0), group(0.5, 0.0)]),
        **config_of(config),
    }


def config_of(config) -> dict:
    return {"experimental_config": config} if config is not None else {}


def parse(b, *, vocab_size=VOCAB, record_bytes=MB4):
    return parse_training_job(b, vocab_size=vocab_size, record_bytes=record_bytes)


def refusal(b, **kwargs) -> WireError:
    with pytest.raises(WireError) as exc:
        parse(b, **kwargs)
    return exc.value


# --- conversion ---------------------------------------------------------------------------------------


def test_it_converts_choices_into_sampled_assistant_turns_keeping_ids_and_logprobs():
    job = parse(body(config={"learning_rate": 3e-5, "ppo": False, "epsilon": 0.3, "scale_rewards": False}))

    assert job.model_id == "7" and len(job.groups) == 2
    assert job.settings == {"learning_rate": 3e-5, "loss": "cispo", "epsilon": 0.3, "scale_rewards": False}
    assert job.tokens == {"client_turns_sampled": 4, "client_turns_retokenized": 0, "client_turns_policy_logprobs": 0}
    record = job.groups[0].trajectories[0]
    system, user, turn = record["messages"]
    assert system == {"role": "system", "content": "Answer briefly."}
    assert user == {"role": "user", "content": "2+2?"}  # the plain message's token_ids dropped
    assert turn == {
        "role": "assistant",
        "content": "4",
        "sampled": True,
        "finish_reason": "stop",
        "token_ids": [19, 2],
        "logprobs": [-0.5, -0.25],
    }
    assert record["reward"] == 1.0 and record["error"] == "" and record["completion_tokens"] == 2
    assert record["duration_ms"] == 250 and record["metrics"] == {"duration": 0.25}
    assert [t["reward"] for t in job.groups[1].trajectories] == [0.5, 0.0]
    assert job.size_bytes > 0


def test_it_reads_token_ids_from_token_id_tokens_and_keeps_tool_calls():
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]
    answer = choice("", [5, 17, 2], [-1.0, -0.5, -0.1], as_tokens=True, finish_reason="tool_calls")
    answer["message"]["tool_calls"] = calls
    answer["prompt_token_ids"] = [1, 9, 4]  # what ART's notebooks copy into each Choice: not needed, not refused
    job = parse(body(group(1.0, 0.0, answer=answer), group(1.0, 0.0)))

    turn = job.groups[0].trajectories[0]["messages"][-1]
    assert turn["token_ids"] == [5, 17, 2] and turn["logprobs"] == [-1.0, -0.5, -0.1]
    assert turn["tool_calls"] == calls and turn["finish_reason"] == "tool_calls" and "prompt_token_ids" not in turn
    assert job.tokens["client_turns_sampled"] == 4


@pytest.mark.parametrize(
    "ids", [[19, VOCAB], [-1, 2], [True, 2], ["19", 2], []], ids=["past-vocab", "negative", "bool", "string", "empty"]
)
def test_ids_that_are_not_this_models_are_dropped_and_the_turn_retokenized(ids):
    answer = choice("4", ids, [-0.5] * len(ids) if ids else None)
    job = parse(body(group(1.0, 0.0, answer=answer), group(1.0, 0.0)))

    turn = job.groups[0].trajectories[0]["messages"][-1]
    assert turn == {"role": "assistant", "content": "4", "sampled": True, "finish_reason": "stop"}
    assert job.tokens == {"client_turns_sampled": 2, "client_turns_retokenized": 2, "client_turns_policy_logprobs": 2}
    assert job.groups[0].trajectories[0]["completion_tokens"] == 0


@pytest.mark.parametrize(
    "logprobs, config",
    [
        (None, None),  # the client asked for no logprobs
        ([-0.5], None),  # fewer than the ids
        ([-0.5, 0.5], None),  # a positive one
        ([-0.5, float("nan")], None),
        ([-0.5, -0.25], {"precalculate_logprobs": True}),  # the client asks for the policy's
    ],
    ids=["missing", "short", "positive", "nan", "precalculate"],
)
def test_ids_without_usable_logprobs_are_kept_for_the_policys_logprobs(logprobs, config):
    answer = choice("4", [19, 2], logprobs)
    answer["token_ids"] = [19, 2]
    job = parse(body(group(1.0, 0.0, answer=answer), group(1.0, 0.0), config=config))

    record = job.groups[0].trajectories[0]
    turn = record["messages"][-1]
    assert turn["sampled_token_ids"] == [19, 2] and "token_ids" not in turn and "logprobs" not in turn
    assert record["completion_tokens"] == 2
    recomputed = 4 if config else 2  # precalculate_logprobs applies to every turn of the job
    assert job.tokens == {
        "client_turns_sampled": 4,
        "client_turns_retokenized": 0,
        "client_turns_policy_logprobs": recomputed,
    }


def test_a_groups_exceptions_become_errored_records_never_trained():
    g = group(1.0, 0.0, metadata={"task": "add"})
    g["exceptions"] = [{"type": "TimeoutError", "message": "tool timed out", "traceback": "Traceback ..."}]
    job = parse(body(g, group(1.0, 0.0)))

    records = job.groups[0].trajectories
    assert len(records) == 3
    errored = records[2]
    assert errored["reward"] is None and errored["messages"] == []
    assert errored["error"] == "TimeoutError\ntool timed out\nTraceback ..."
    assert job.groups[0].scenario == {"task": "add"}


# --- the scenario of each group ------------------------------------------------------------------------


def test_the_scenario_is_the_groups_metadata_else_the_shared_one_else_the_group_index():
    shared = group(1.0, 0.0, metadata=None)
    for t in shared["trajectories"]:
        t["metadata"] = {"question": "2+2", "level": 1}
    differing = group(1.0, 0.0)
    differing["trajectories"][0]["metadata"] = {"question": "2+2"}
    differing["trajectories"][1]["metadata"] = {"question": "3+3"}
    job = parse(body(group(1.0, 0.0, metadata={"task": "add", "n": 3}), shared, differing, group(0.5, 0.0)))

    assert [g.scenario for g in job.groups] == [
        {"task": "add", "n": 3},
        {"question": "2+2", "level": 1},
        {"group": 2},
        {"group": 3},  # no metadata at all
    ]


# --- refusals ------------------------------------------------------------------------------------------


def _at(path):
    """A mutation of body()'s default: set the value at a path of keys and indexes."""

    def set_(value):
        def apply(b):
            node = b
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value

        return apply

    return set_


T11 = ("trajectory_groups", 1, "trajectories", 1)
G1 = ("trajectory_groups", 1)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (_at((*G1, "bogus"))(1), "group 1 has fields artweb does not know: bogus"),
        (_at((*T11, "start_time"))("x"), "group 1, trajectory 1 has fields artweb does not know: start_time"),
        (lambda b: b["trajectory_groups"][1]["trajectories"].pop(), "group 1 has 1 trajectories"),
        (_at((*G1, "trajectories"))(None), "group 1 has no list of trajectories"),
        (_at((*T11, "reward"))(float("nan")), "group 1, trajectory 1: reward must be a finite number"),
        (_at((*T11, "reward"))(float("inf")), "group 1, trajectory 1: reward must be a finite number"),
        (_at((*T11, "reward"))(True), "group 1, trajectory 1: reward must be a finite number"),
        (_at((*T11, "reward"))("1.0"), "group 1, trajectory 1: reward must be a finite number"),
        (_at((*T11, "reward"))(None), "group 1, trajectory 1: reward must be a finite number"),
        (
            _at((*T11, "additional_histories"))([{"messages_and_choices": [], "bogus": None}]),
            "group 1, trajectory 1, additional history 0 has fields artweb does not know: bogus",
        ),
        (_at((*T11, "messages_and_choices"))("hi"), "group 1, trajectory 1: messages_and_choices must be a list"),
        (_at((*T11, "messages_and_choices", 0))("hi"), "group 1, trajectory 1, item 0 is neither a message nor"),
        (_at((*T11, "messages_and_choices", 0))({"content": "x"}), "group 1, trajectory 1, item 0 is a message"),
        (_at((*T11, "messages_and_choices", 2, "message"))("4"), "group 1, trajectory 1, item 2 is a Choice whose"),
        (
            _at((*T11, "messages_and_choices", 2, "message", "content"))(["4"]),
            "group 1, trajectory 1, item 2 is a Choice whose message content is neither a string nor null",
        ),
        (
            _at((*T11, "messages_and_choices", 2, "message", "tool_calls"))(["add(2)"]),
            "group 1, trajectory 1, item 2 is a Choice whose message tool_calls is not a list of objects",
        ),
        (_at((*T11, "metadata"))({"nested": {"a": 1}}), "group 1, trajectory 1: metadata must be an object of"),
        (_at((*T11, "metrics"))({"score": "high"}), "group 1, trajectory 1: metrics must be an object of finite"),
        (_at((*T11, "logs"))([1]), "group 1, trajectory 1: logs must be a list of strings"),
        (_at((*T11, "tools"))({"name": "add"}), "group 1, trajectory 1: tools must be a list or null"),
        (_at((*G1, "metadata"))([1]), "group 1: metadata must be an object of"),
        (_at((*G1, "metrics"))({"x": float("nan")}), "group 1: metrics must be an object of finite"),
        (_at((*G1, "exceptions"))(["boom"]), "group 1, exception 0 is not an object"),
        (_at(G1)([]), "group 1 is not an object"),
        (_at((*G1, "trajectories", 1))("t"), "group 1, trajectory 1 is not an object"),
    ],
)
def test_a_bad_group_or_trajectory_is_refused_naming_where(mutate, expected):
    b = body()
    mutate(b)
    assert expected in str(refusal(b))


def test_a_group_past_the_size_limit_is_refused():
    g = group(1.0, 0.0)
    g["trajectories"] = [copy.deepcopy(g["trajectories"][0]) for _ in range(257)]
    assert "group 0 has 257 trajectories; at most 256" in str(refusal(body(g, group(1.0, 0.0))))


@pytest.mark.parametrize(
    "b, expected, param",
    [
        ([], "must be a JSON object", None),
        ({**body(), "learning_rate": 1e-5}, "The training job has fields artweb does not know: learning_rate", None),
        ({**body(), "model_id": None}, "'model_id' is required", "model_id"),
        ({**body(), "trajectory_groups": []}, "'trajectory_groups' must be a non-empty list", "trajectory_groups"),
        (
            {**body(), "trajectory_groups": [group(1.0, 0.0)] * (MAX_GROUPS + 1)},
            f"at most {MAX_GROUPS} groups, got {MAX_GROUPS + 1}",
            "trajectory_groups",
        ),
        (body(config=[]), "'experimental_config' must be an object or null", "experimental_config"),
        (body(config={"beta": 0.1}), "experimental_config has fields artweb does not know: beta", None),
        (body(config={"learning_rate": 0}), "learning_rate must be in (0, 1], got 0", "experimental_config"),
        (body(config={"learning_rate": 2.0}), "learning_rate must be in (0, 1], got 2", "experimental_config"),
        (body(config={"learning_rate": -1e-5}), "learning_rate must be in (0, 1]", "experimental_config"),
        (body(config={"epsilon": 5}), "epsilon must be in (0, 1], got 5", "experimental_config"),
    ],
    ids=[
        "not-object",
        "unknown-field",
        "model-id",
        "no-groups",
        "too-many-groups",
        "config-not-object",
        "config-unknown",
        "lr-zero",
        "lr-big",
        "lr-negative",
        "epsilon",
    ],
)
def test_a_bad_body_is_refused_naming_the_field(b, expected, param):
    exc = refusal(b)
    assert expected in str(exc) and exc.param == param


@pytest.mark.parametrize(
    "key, value",
    [
        ("advantage_balance", 0.5),
        ("importance_sampling_level", "sequence"),
        ("max_negative_advantage_importance_sampling_weight", 2.0),
        ("mask_prob_ratio", True),
        ("kimi_k2_tau", 0.1),
    ],
)
def test_an_experimental_setting_artweb_cannot_honour_is_refused_by_name(key, value):
    exc = refusal(body(config={key: value}))
    assert f"experimental_config.{key}={value!r} is not supported" in str(exc)
    assert exc.param == f"experimental_config.{key}"


def test_arts_defaults_in_experimental_config_are_accepted():
    defaults = {
        "learning_rate": None,
        "ppo": None,
        "epsilon": None,
        "epsilon_high": None,
        "advantage_balance": 0.0,
        "scale_rewards": None,
        "importance_sampling_level": "token",
        "max_negative_advantage_importance_sampling_weight": None,
        "mask_prob_ratio": False,
        "kimi_k2_tau": None,
        "precalculate_logprobs": None,
    }
    assert parse(body(config=defaults)).settings == {}
    assert parse(body(config={"ppo": True})).settings == {"loss": "ppo"}


def test_a_job_without_any_sampled_choice_is_refused():
    b = body()
    for g in b["trajectory_groups"]:
        for t in g["trajectories"]:
            t["messages_and_choices"][-1] = {"role": "assistant", "content": "4"}  # a plain dict, not the Choice
    assert "No trajectory holds a completion the model sampled" in str(refusal(b))


def test_a_job_whose_every_group_has_equal_rewards_is_refused():
    exc = refusal(body(group(1.0, 1.0), group(0.0, 0.0)))
    assert "Every group's trajectories have the same reward" in str(exc)
    # One group that tells its trajectories apart is enough: the others are skipped in the update.
    assert len(parse(body(group(1.0, 1.0), group(1.0, 0.0))).groups) == 2


def test_a_trajectory_past_the_size_limit_is_refused_naming_it():
    big = group(1.0, 0.0)
    big["trajectories"][1]["messages_and_choices"][1]["content"] = "x" * 5000
    exc = refusal(body(group(1.0, 0.0), big), record_bytes=4000)
    assert "group 1, trajectory 1 is larger than" in str(exc) and "the limit for one trajectory" in str(exc)
    assert parse(body(group(1.0, 0.0), group(1.0, 0.0)), record_bytes=4000).size_bytes < 4 * 4000


# --- registering a model -------------------------------------------------------------------------------


def test_a_model_registration_is_read_and_trimmed():
    data = parse_model_create({"entity": None, "project": " p ", "name": "m1", "base_model": "SmolLM2-135M-Instruct"})
    assert data == {
        "project": "p",
        "name": "m1",
        "base_model": "SmolLM2-135M-Instruct",
        "entity": None,
        "return_existing": False,
    }
    assert parse_model_create({"entity": "team", "project": "p", "name": "m", "base_model": "b", "return_existing": 1})[
        "return_existing"
    ]


@pytest.mark.parametrize(
    "b, param",
    [
        ("models", None),
        ({"name": "m", "base_model": "b"}, "project"),
        ({"project": "p", "name": " ", "base_model": "b"}, "name"),
        ({"project": "p", "name": "m", "base_model": 3}, "base_model"),
        ({"project": "p", "name": "a/b", "base_model": "b"}, "name"),
        ({"project": "p:1", "name": "m", "base_model": "b"}, "project"),
        ({"project": "p", "name": "m@2", "base_model": "b"}, "name"),
        ({"project": "p", "name": "m" * 101, "base_model": "b"}, "name"),
        ({"project": "p", "name": "m", "base_model": "b", "entity": 5}, "entity"),
        ({"project": "p", "name": "m", "base_model": "b", "entity": ""}, "entity"),
        ({"project": "p", "name": "m", "base_model": "b", "entity": "e" * 101}, "entity"),
        ({"project": "p", "name": "m", "base_model": "b", "entity": "a/b"}, "entity"),
    ],
)
def test_a_bad_model_registration_is_refused_naming_the_field(b, param):
    with pytest.raises(WireError) as exc:
        parse_model_create(b)
    assert exc.value.param == param
    if param:
        assert f"'{param}'" in str(exc.value)
