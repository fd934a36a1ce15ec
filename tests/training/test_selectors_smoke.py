from artweb.testing.factories import RunFactory
from training.selectors import run_get, run_list, run_metrics


def test_it_scopes_runs_to_their_owner(alice, bob):
    mine = RunFactory(owner=alice)
    RunFactory(owner=bob)
    assert list(run_list(user=alice)) == [mine]


def test_it_downsamples_metrics_keeping_spikes(alice):
    run = RunFactory(owner=alice, num_steps=2000)
    from training.models import Step

    Step.objects.bulk_create(
        [Step(run=run, step=i, reward_mean=(100.0 if i == 777 else 0.5), metrics={"loss": 0.1}) for i in range(1, 2001)]
    )
    data = run_metrics(run=run, series=["reward_mean", "loss"], max_points=200)
    assert len(data["series"]["reward_mean"]["x"]) <= 200
    assert 100.0 in data["series"]["reward_mean"]["y"]
    assert 777 in data["series"]["reward_mean"]["x"]
    assert data["last_step"] == 2000
    assert run_get(user=alice, run_id=run.id) == run
