"""The benchmark's held-out verdict: artweb against TRL, one seed or several."""

import pytest

from bench.trl_compare import _heldout_lines, heldout_difference


def _result(per_scenario):
    return {"per_scenario": per_scenario, "reward_mean": sum(per_scenario) / len(per_scenario)}


def test_one_seed_is_paired_over_the_held_out_scenarios():
    results = {"artweb-0": _result([0.5, 0.7, 0.9]), "trl-0": _result([0.6, 0.7, 0.7])}
    held = heldout_difference(results, [0])
    # diffs -0.1, 0.0, +0.2: mean 0.0333, sample sd 0.1528, SE 0.0882
    assert held["diff"] == pytest.approx(0.1 / 3)
    assert held["se"] == pytest.approx(0.15275 / 3**0.5, rel=1e-3)
    assert held["no_worse"] is True
    assert "paired over the 3 held-out scenarios" in held["unit"]
    assert "| seed |" not in "\n".join(_heldout_lines(held))


def test_several_seeds_are_judged_on_the_spread_between_seeds():
    results = {
        "artweb-0": _result([0.70, 0.80]),  # -0.05 against TRL
        "trl-0": _result([0.75, 0.85]),
        "artweb-1": _result([0.60, 0.70]),  # +0.05
        "trl-1": _result([0.55, 0.65]),
        "artweb-2": _result([0.70, 0.70]),  # -0.09
        "trl-2": _result([0.79, 0.79]),
    }
    held = heldout_difference(results, [0, 1, 2])
    assert [r["diff"] for r in held["per_seed"]] == pytest.approx([-0.05, 0.05, -0.09])
    assert held["diff"] == pytest.approx(-0.03)
    # stdev(-0.05, 0.05, -0.09) = 0.07211; / sqrt(3)
    assert held["se"] == pytest.approx(0.072111 / 3**0.5, rel=1e-4)
    assert held["no_worse"] is True
    assert held["artweb"] == pytest.approx((0.75 + 0.65 + 0.70) / 3)
    text = "\n".join(_heldout_lines(held))
    assert "mean over 3 seeds" in text and "no worse than TRL's" in text
    assert "| 2 | 0.700 | 0.790 | -0.090" in text


def test_a_difference_beyond_one_standard_error_is_reported_as_worse():
    results = {}
    for seed, (a, t) in enumerate([(0.70, 0.80), (0.71, 0.79), (0.69, 0.80)]):
        results[f"artweb-{seed}"], results[f"trl-{seed}"] = _result([a, a]), _result([t, t])
    held = heldout_difference(results, [0, 1, 2])
    assert held["diff"] == pytest.approx(-0.0967, abs=1e-3)
    assert held["no_worse"] is False
    assert "worse than TRL's (target" in _heldout_lines(held)[0]


def test_named_sides_and_a_match_either_way():
    """bench.client_run compares the uploaded script with the ART client: `within` holds only when the
    difference is inside one standard error on both sides."""
    results = {
        "script-0": _result([0.80, 0.90]),
        "client-0": _result([0.70, 0.70]),  # +0.15
        "script-1": _result([0.60, 0.60]),
        "client-1": _result([0.55, 0.55]),  # +0.05
    }
    held = heldout_difference(results, [0, 1], first="script", second="client")
    assert held["diff"] == pytest.approx(0.10)
    assert held["se"] == pytest.approx(0.05)  # stdev(0.15, 0.05) = 0.0707; / sqrt(2)
    assert held["no_worse"] is True and held["within"] is False
    # Differences -0.05 and +0.05: mean 0, standard error 0.05.
    close = heldout_difference({**results, "client-0": _result([0.90, 0.90])}, [0, 1], "script", "client")
    assert close["diff"] == pytest.approx(0.0) and close["se"] == pytest.approx(0.05) and close["within"] is True
    assert [r["script"] for r in held["per_seed"]] == pytest.approx([0.85, 0.60])
    assert held["client"] == pytest.approx((0.70 + 0.55) / 2)
