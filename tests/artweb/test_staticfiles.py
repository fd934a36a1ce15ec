"""The static files storage with DEBUG off: collectstatic's hashed names where it ran, the plain name (served
from the source by WhiteNoise's finders) where it did not, never an error that fails the page."""

import json

from artweb.staticfiles import CollectedStaticFilesStorage


def test_it_uses_the_hashed_name_of_a_collected_file_and_the_plain_name_otherwise(tmp_path, settings):
    settings.DEBUG = False  # the manifest storage gives plain names under DEBUG, whatever was collected
    never_collected = CollectedStaticFilesStorage(location=tmp_path / "empty", base_url="/static/")
    assert never_collected.url("frontend/app.css") == "/static/frontend/app.css"

    (tmp_path / "collected").mkdir()
    manifest = {"version": "1.1", "hash": "0", "paths": {"frontend/app.css": "frontend/app.0123abcd.css"}}
    (tmp_path / "collected" / "staticfiles.json").write_text(json.dumps(manifest))
    collected = CollectedStaticFilesStorage(location=tmp_path / "collected", base_url="/static/")
    assert collected.url("frontend/app.css") == "/static/frontend/app.0123abcd.css"
    assert collected.url("frontend/added-since.js") == "/static/frontend/added-since.js"
