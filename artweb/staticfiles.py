"""Static files storage for DEBUG off: collectstatic's hashed, compressed files when they were collected,
the plain name otherwise."""

from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage


class CollectedStaticFilesStorage(CompressedManifestStaticFilesStorage):
    """WhiteNoise's manifest storage that answers a name missing from the manifest (collectstatic never
    ran, or ran before the file was added) with the plain name instead of raising: WhiteNoise serves that
    from the source through its finders (settings.WHITENOISE_USE_FINDERS), so a page never fails to render
    over a static file."""

    def stored_name(self, name):
        try:
            return super().stored_name(name)
        except ValueError:  # "Missing staticfiles manifest entry"
            return name
