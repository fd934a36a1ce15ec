"""The run page's action buttons follow the actions the server sends (training.services.runs.run_actions):
first from the page's data, then from each status message on the socket. The page holds no rule of its own."""

import pytest

from artweb.testing.factories import RunFactory
from tests.browser.test_dashboard import as_worker
from training.services.runs import run_pause

pytestmark = pytest.mark.timeout(120)


def _enabled(page) -> list[str]:
    return page.evaluate(
        "[...document.querySelectorAll('#run-actions [data-action]')].filter((b) => !b.disabled)"
        ".map((b) => b.dataset.action)"
    )


def test_the_buttons_follow_the_status_messages_actions(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, status="queued")
    page.goto(f"/runs/{run.id}/")
    page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")
    assert _enabled(page) == ["cancel", "pause"]

    as_worker(run_pause, run=run, actor=user)  # queued: paused at once, the status message sent on commit
    page.wait_for_function("!document.querySelector('#run-actions [data-action=resume]').disabled")
    assert _enabled(page) == ["cancel", "resume"]
    assert not page.console_errors, page.console_errors
