"""BaseModel is renamed PretrainedModel (the name read as pydantic's BaseModel). The table keeps its name,
training_basemodel: only Django's record of the model changes, and its content type is renamed with it."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0010_trajectories_dry_runs_from_rollouts"),
    ]

    operations = [
        migrations.AlterModelTable(name="basemodel", table="training_basemodel"),
        migrations.RenameModel(old_name="BaseModel", new_name="PretrainedModel"),
        migrations.AlterModelOptions(
            name="pretrainedmodel", options={"ordering": ["name"], "verbose_name": "base model"}
        ),
    ]
