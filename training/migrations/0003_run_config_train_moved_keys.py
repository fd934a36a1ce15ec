"""Run configs drop `train.seed` and `train.group_size`, which TrainConfig no longer has (it rejects
unknown keys, so a stored config must lose them to validate). The trainer's seed is now the run's `seed`,
and the rollouts per scenario were always the run's `group_size`; `train.group_size` was read nowhere.

A run that resumes from a checkpoint continues exactly as before (the checkpoint's saved RNG states
continue it, not the seed). One that had set `train.seed` apart from `seed` and has no checkpoint yet
initialises its LoRA from `seed`.
"""

from django.db import migrations

MOVED = ("seed", "group_size")


def drop_moved_keys(apps, schema_editor):
    Run = apps.get_model("training", "Run")
    changed = []
    for run in Run.objects.filter(config__train__has_any_keys=list(MOVED)).only("id", "config").iterator():
        for key in MOVED:
            run.config["train"].pop(key, None)
        changed.append(run)
        if len(changed) >= 500:
            Run.objects.bulk_update(changed, ["config"])
            changed = []
    Run.objects.bulk_update(changed, ["config"])


class Migration(migrations.Migration):
    dependencies = [("training", "0002_exports")]

    # Backwards, the configs stay as they are: the keys would be defaults again, filled in on validation.
    operations = [migrations.RunPython(drop_moved_keys, migrations.RunPython.noop)]
