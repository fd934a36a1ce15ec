from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    name = "rollouts"
    verbose_name = "Rollouts"
