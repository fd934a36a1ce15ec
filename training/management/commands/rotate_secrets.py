"""manage.py rotate_secrets: re-encrypt the stored export and judge secrets under the current SECRET_KEY."""

from django.core.management.base import BaseCommand

from training.exports.crypto import secrets_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt stored export-target and judge secrets under the current SECRET_KEY. After a rotation: set "
        "the new SECRET_KEY, list the old one in SECRET_KEY_FALLBACKS, run this, then remove the fallback."
    )

    def handle(self, *args, **options):
        result = secrets_rotate()
        self.stdout.write(f"{result.rotated} stored secret(s) re-encrypted under the current SECRET_KEY.")
        if result.unreadable:
            self.stderr.write(
                f"{result.unreadable} stored secret(s) open under no configured key and were left as they are: "
                "add the key they were saved under to SECRET_KEY_FALLBACKS and run this again, or have their "
                "owners enter them again."
            )
