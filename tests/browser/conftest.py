"""Browser fixtures: the ASGI server on the test database, Debian's headless Chromium, signed-in pages.

Tests here use transactional_db: the server is another process, so rows must really be committed.
"""

import os
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from artweb.launcher.embedded import free_port
from artweb.testing.web import CHROMIUM, CHROMIUM_ARGS, AsgiServer, database_url

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
PASSWORD = "browser-pass-123"


@pytest.fixture(scope="session")
def channel_prefix():
    """A channel-layer prefix of this session's own, shared by the test process and the server, so
    broadcasts of concurrent test sessions (whose run ids overlap) never cross."""
    from channels.layers import channel_layers

    config = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    before = config.get("prefix")
    prefix = f"artweb-browser-{uuid.uuid4().hex[:8]}"
    config["prefix"] = prefix
    channel_layers.backends.clear()
    yield prefix
    config["prefix"] = before
    channel_layers.backends.clear()


@pytest.fixture(scope="session")
def egress_port():
    """A port on 127.0.0.1 the server's egress guard lets through (ARTWEB_EGRESS_ALLOW), for a local
    server standing in for an external service (an export target's)."""
    return free_port()


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, channel_prefix, egress_port):
    ARTIFACTS.mkdir(exist_ok=True)
    from django.db import connection

    server = AsgiServer(
        database_url=database_url(connection.settings_dict),
        channel_prefix=channel_prefix,
        broker_url=os.environ.get("ARTWEB_TEST_IDLE_BROKER", "redis://127.0.0.1:6379/15"),
        log_path=ARTIFACTS / "asgi-server.log",
        egress_allow=f"127.0.0.1:{egress_port}",
    ).start()
    yield server
    server.stop()  # before the test database is dropped: the server holds connections to it


@pytest.fixture(scope="module")  # the sync API holds an event loop on this thread until it stops
def browser(asgi_server):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread, which makes Django refuse ORM calls
    # from the (synchronous) test code; the tests are not async, so allow them while the browser runs.
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            yield b
            b.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def page(browser, asgi_server, transactional_db):
    context = browser.new_context(base_url=asgi_server.url, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(15_000)
    pg = context.new_page()
    pg.console_errors = []
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
    pg.on("pageerror", lambda e: pg.console_errors.append(str(e)))
    yield pg
    context.close()


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice", "alice@example.com", PASSWORD)


@pytest.fixture
def signed_in(page, user):
    page.goto("/accounts/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/")
    return page


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
