"""Stored uploads are readable by the server's user only (FILE_UPLOAD_* settings)."""

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage


def test_uploaded_files_and_their_folders_are_private(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "uploads"  # the storage follows MEDIA_ROOT through setting_changed
    name = default_storage.save("alice/scripts/rollout.py", ContentFile(b"print('hi')\n"))
    path = settings.MEDIA_ROOT / name
    assert path.stat().st_mode & 0o777 == 0o600
    assert (settings.MEDIA_ROOT / "alice").stat().st_mode & 0o777 == 0o700
    assert path.parent.stat().st_mode & 0o777 == 0o700
