"""The web server's process does Django's first-request work as it starts: once artweb.asgi is imported,
every view module behind the URLconf is loaded and the first pages' templates are compiled, so a visitor's
first page is not the one that pays for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
before = {"views": "training.views.runs" in sys.modules}
import artweb.asgi
from django.template import engines
loader = engines["django"].engine.template_loaders[0]
print(json.dumps({
    **before,
    "views_after": "training.views.runs" in sys.modules and "rollouts.views" in sys.modules,
    "cached": sorted(name for name in getattr(loader, "get_template_cache", {}) if name.endswith(".html")),
}))
"""


def test_importing_the_asgi_application_loads_the_views_and_the_first_templates():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "artweb.settings", "DEBUG": "false"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["views"] is False and seen["views_after"] is True
    assert {"base.html", "registration/login.html"} <= set(seen["cached"])
