# Trajectory.additional_histories: ART's conversations beside a trajectory's main one.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0017_plural_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="trajectory",
            name="additional_histories",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
