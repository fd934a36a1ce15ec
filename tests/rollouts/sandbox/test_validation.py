from rollouts.sandbox.validation import MAX_SOURCE_BYTES, validate_reward, validate_script

GOOD_SCRIPT = """
import art

async def rollout(model: art.Model, scenario) -> art.Trajectory:
    return art.Trajectory(reward=1.0)
"""


def test_it_accepts_an_art_style_script():
    assert validate_script(GOOD_SCRIPT) == []


def test_it_reports_a_syntax_error_with_its_line():
    issues = validate_script("import art\n\nasync def rollout(model, scenario)\n    pass\n")
    assert issues[0]["line"] == 3
    assert "Syntax error" in issues[0]["message"]


def test_it_requires_an_async_rollout_with_two_parameters():
    issues = validate_script("import art\n\ndef rollout(model):\n    pass\n")
    assert [i["line"] for i in issues] == [3, 3]
    assert "async" in issues[0]["message"] and "two arguments" in issues[1]["message"]


def test_it_requires_a_rollout_function():
    issues = validate_script("x = 1\n")
    assert issues[0]["line"] is None and "async def rollout(model, scenario)" in issues[0]["message"]


def test_it_rejects_non_utf8_and_oversized_uploads():
    issues = validate_script(b"x = 1\ny = '\xff'\n")
    assert issues[0]["line"] == 2 and "UTF-8" in issues[0]["message"]
    assert "limit" in validate_script("#" * (MAX_SOURCE_BYTES + 1))[0]["message"]


def test_it_tells_trajectory_and_group_rewards_apart():
    assert validate_reward("def reward(trajectory, scenario):\n    return 1.0\n") == ("trajectory", [])
    assert validate_reward("async def score_group(group, scenario):\n    return [1.0]\n") == ("group", [])


def test_it_rejects_reward_files_without_one_clear_entry_point():
    kind, issues = validate_reward("def score(t):\n    return 1\n")
    assert kind is None and "def reward(trajectory, scenario)" in issues[0]["message"]
    kind, issues = validate_reward("def reward(t, s):\n    return 1\n\n\ndef score_group(g, s):\n    return []\n")
    assert kind is None and issues[0]["line"] == 5
    kind, issues = validate_reward("def reward(trajectory):\n    return 1\n")
    assert issues == [{"line": 1, "message": "`reward` must take two arguments, (trajectory, scenario)."}]
