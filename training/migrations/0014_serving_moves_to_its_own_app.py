"""CheckpointAlias, ServeJob and DiffScenario move from training to the serving app (training.serving).
Only Django's record of the models moves; the tables keep their names (training_checkpointalias,
training_servejob, training_diffscenario) and no row is copied. serving 0001 adds the models to serving's
state before this one removes them from training's."""

from django.db import migrations

MOVED = ("checkpointalias", "servejob", "diffscenario")


def _content_types_move(apps, source: str, target: str) -> None:
    """Give the moved models' content types (and so their permissions and admin log) to the target app. A
    content type the target already has gives way: `migrate` makes one for each model it knows when it
    ends, so going back and forth leaves a new one, with no history, beside the one that holds it."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        moving = ContentType.objects.filter(app_label=source, model=model)
        if moving.exists():
            ContentType.objects.filter(app_label=target, model=model).delete()
            moving.update(app_label=target)


def content_types_to_serving(apps, schema_editor):
    _content_types_move(apps, "training", "serving")


def content_types_to_training(apps, schema_editor):
    _content_types_move(apps, "serving", "training")


class Migration(migrations.Migration):
    dependencies = [
        # The content types' dependents (permissions, admin log entries) in the state: deleting one (see
        # _content_types_move) deletes its permissions and clears its log entries' reference.
        ("admin", "0003_logentry_add_action_flag_choices"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("serving", "0001_initial"),
        ("training", "0013_quotas"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.DeleteModel(name="DiffScenario"),
                migrations.DeleteModel(name="ServeJob"),
                migrations.DeleteModel(name="CheckpointAlias"),
            ],
        ),
        migrations.RunPython(content_types_to_serving, content_types_to_training),
    ]
