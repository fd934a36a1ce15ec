"""An export target in a real browser (Debian's headless Chromium) against the ASGI server: added from
the Exports page, tested from its page, deleted.

The test event goes to a local endpoint that records it and answers as Langfuse's ingestion API does
(a real Langfuse cannot run here). Screenshots go to tests/artifacts/.
"""

import re

import pytest

from tests.browser.conftest import shot
from tests.exports.conftest import start_recording_server
from training.exports.selectors import export_target_secret
from training.models import ExportTarget

pytestmark = pytest.mark.timeout(120)

SECRET = "sk-lf-browser-secret-4321"


@pytest.fixture
def endpoint(egress_port):
    rec = start_recording_server(egress_port)  # on the port the server's egress guard allows
    yield rec
    rec.stop()


def test_it_adds_tests_and_deletes_an_export_target(signed_in, user, endpoint):
    page = signed_in
    page.click("nav >> text=Exports")
    page.wait_for_url("**/exports/")
    page.click("a[data-kind=langfuse]")
    page.wait_for_url("**/exports/new/langfuse/")

    page.fill("#id_host", "not-a-url")  # an inline error from the schema, nothing created
    page.click("button[data-action=save]")
    assert "http:// or https://" in page.locator("#id_host_errors").inner_text()
    assert not ExportTarget.objects.exists()

    page.fill("#id_host", endpoint.url)
    page.fill("#id_public_key", "pk-lf-browser")
    page.fill("#id_secret", SECRET)
    page.click("button[data-action=save]")
    page.wait_for_url(re.compile(r"/exports/\d+/$"))
    target = ExportTarget.objects.get(owner=user, kind="langfuse")
    assert export_target_secret(target) == SECRET
    assert page.locator("#export-key").inner_text() == "••••4321"
    assert SECRET not in page.content()
    assert page.input_value("#id_secret") == ""  # never sent back, not even into the form

    page.click("button[data-action=test]")
    page.wait_for_url(re.compile(r"/exports/\d+/$"))
    status = page.locator(".alert-success")
    assert "Test event sent." in status.inner_text()
    assert f"Langfuse at {endpoint.url} accepted a test trace" in status.inner_text()
    (request,) = endpoint.requests
    assert request["body"]["batch"][0]["body"]["name"] == "artweb connection test"
    shot(page, "export-target-tested")

    page.click("text=Delete this export")
    page.click("button[data-action=delete]")
    page.wait_for_url("**/exports/")
    assert "Langfuse export for all your runs deleted." in page.locator(".alert-success").inner_text()
    assert "No exports yet" in page.inner_text("main")
    assert not ExportTarget.objects.exists()
    assert not page.console_errors, page.console_errors
