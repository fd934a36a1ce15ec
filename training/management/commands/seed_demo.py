"""Load the example task (rollout script, reward function, scenario set) for the admin, so a first run
needs nothing but a click, and the tool-calling example (a script that sets its own reward, and its
scenarios). Idempotent: assets that already exist by name are left alone."""

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

import rollouts
from artweb.errors import ApplicationError
from rollouts.models import RewardFunction, RolloutScript, ScenarioSet
from rollouts.services import reward_create, scenario_set_create, script_companion_set, script_create

EXAMPLES_DIR = Path(rollouts.__file__).resolve().parent / "examples"
SCRIPT_NAME = "Example rollout"
REWARD_NAME = "Example reward"
SCENARIOS_NAME = "Example scenarios"
# Named to sort after the example task's: the launch form preselects the first script and scenario set.
TOOL_SCRIPT_NAME = "Example tool agent"
TOOL_SCENARIOS_NAME = "Example tool scenarios"


class Command(BaseCommand):
    help = "Register the example rollout script, reward function and scenario set for the admin user."

    def add_arguments(self, parser):
        parser.add_argument("--owner", help="username that owns the demo (default: the first superuser)")

    def handle(self, *args, owner=None, **options):
        owner = self._owner(owner)
        names = ("rollout.py", "reward.py", "scenarios.jsonl", "tool_rollout.py", "tool_scenarios.jsonl")
        files = {name: EXAMPLES_DIR / name for name in names}
        missing = [str(path) for path in files.values() if not path.exists()]
        if missing:
            raise CommandError(f"The example files are missing: {', '.join(missing)}.")
        steps = [
            (
                RolloutScript,
                SCRIPT_NAME,
                lambda: script_create(owner=owner, name=SCRIPT_NAME, content=files["rollout.py"].read_text()),
            ),
            (
                RewardFunction,
                REWARD_NAME,
                lambda: reward_create(owner=owner, name=REWARD_NAME, content=files["reward.py"].read_text()),
            ),
            (
                ScenarioSet,
                SCENARIOS_NAME,
                lambda: scenario_set_create(
                    owner=owner,
                    name=SCENARIOS_NAME,
                    jsonl=files["scenarios.jsonl"].read_text(),
                    validation_fraction=0.2,
                ),
            ),
            (
                RolloutScript,
                TOOL_SCRIPT_NAME,
                lambda: script_create(owner=owner, name=TOOL_SCRIPT_NAME, content=files["tool_rollout.py"].read_text()),
            ),
            (
                ScenarioSet,
                TOOL_SCENARIOS_NAME,
                lambda: scenario_set_create(
                    owner=owner, name=TOOL_SCENARIOS_NAME, jsonl=files["tool_scenarios.jsonl"].read_text()
                ),
            ),
        ]
        for model, name, create in steps:
            if model.objects.filter(owner=owner, name=name).exists():
                self.stdout.write(f"{model._meta.verbose_name.capitalize()} {name!r} exists already; left as is.")
                continue
            try:
                create()
            except ApplicationError as exc:
                raise CommandError(f"Could not load {name!r}: {exc.message}") from exc
            self.stdout.write(self.style.SUCCESS(f"Loaded {model._meta.verbose_name} {name!r} for {owner}."))
        # The example script sets no reward itself: its reward function goes with it on the launch form.
        script = RolloutScript.objects.get(owner=owner, name=SCRIPT_NAME)
        if script.companion_reward_id is None:
            script_companion_set(script=script, reward=RewardFunction.objects.get(owner=owner, name=REWARD_NAME))

    def _owner(self, username):
        users = get_user_model().objects
        if username:
            user = users.filter(username=username).first()
            if user is None:
                raise CommandError(f"There is no user {username!r}.")
            return user
        user = users.filter(is_superuser=True).order_by("id").first()
        if user is None:
            raise CommandError("There is no admin user yet: create one with `python manage.py createsuperuser`.")
        return user
