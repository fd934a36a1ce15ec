"""bench/step_phases.py prints a run's phase times as bench/run_curve.py prints the benchmark's."""

import pytest

from artweb.testing.factories import RunFactory, StepFactory
from bench import step_phases


@pytest.mark.django_db
def test_it_prints_each_step_and_the_median_of_each_phase(alice, capsys):
    run = RunFactory(owner=alice)
    for step, (rollouts, train) in enumerate([(4.0, 10.0), (2.0, 12.0), (3.0, 11.0)], start=1):
        StepFactory(
            run=run,
            step=step,
            reward_mean=0.1 * step,
            timings={"rollouts": rollouts, "train": train, "step": rollouts + train + 1.0},
        )
    assert step_phases.main([str(run.id)]) == 0
    out = capsys.readouterr().out
    assert "   2        0.200" in out and "15.0" in out  # step 2: reward, step seconds
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert lines["rollouts"] == ["3.00", "20.0%"]  # median 3 s of a median 15 s step
    assert lines["train"] == ["11.00", "73.3%"]
    assert lines["step"] == ["15.00", "100.0%"]


@pytest.mark.django_db
def test_it_leaves_out_the_first_steps_when_asked(alice, capsys):
    run = RunFactory(owner=alice)
    StepFactory(run=run, step=1, timings={"rollouts": 60.0, "step": 90.0})
    StepFactory(run=run, step=2, timings={"rollouts": 5.0, "step": 10.0})
    assert step_phases.main([str(run.id), "--skip-first", "1"]) == 0
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines["rollouts"] == ["5.00", "50.0%"]


@pytest.mark.django_db
def test_it_says_what_to_check_for_an_unknown_run(capsys):
    assert step_phases.main(["987654"]) == 2
    assert "no run 987654" in capsys.readouterr().err
