"""A person's secrets for their runs' tools (an API key): stored encrypted, never shown again, and given
to the jail of their runs that name them as environment variables (training.services.tools).

Kept out of training/models.py for its length; that module imports it, so it is a model of this app.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class UserSecret(models.Model):
    """One secret: its name is the environment variable a run's processes get it as. The value is stored
    encrypted (training.exports.crypto) and only its last four characters are ever shown (long ones only)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_secrets")
    name = models.CharField(max_length=100, help_text="The environment variable's name, e.g. SEARCH_API_KEY.")
    value_encrypted = models.TextField()
    value_last4 = models.CharField(max_length=4, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="uniq_user_secret_owner_name")]
        # Granted in the admin to users or groups; counts where ARTWEB_NAMED_HOSTS=permitted.
        permissions = [("use_named_hosts", "Can let runs reach named hosts (ARTWEB_NAMED_HOSTS=permitted)")]

    def __str__(self):
        return f"secret {self.name} of {self.owner}"
