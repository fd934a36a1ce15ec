"""The launch page's "Score the base model's answers" carries the ticked data attachments to the dry-run form,
in a real browser: a script that reads /data/<name> gets its file in the dry run too."""

import hashlib

import pytest

from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    ScenarioSetFactory,
)
from rollouts.models import DataAttachment
from tests.browser.test_dashboard import assert_no_console_errors
from training.models import DryRun

pytestmark = pytest.mark.timeout(120)


def test_the_ticked_attachments_go_with_the_link_into_the_dry_run(signed_in, user):
    page = signed_in
    BaseModelFactory()
    RolloutScriptVersionFactory(asset__owner=user, asset__name="inbox-agent")
    RewardFunctionVersionFactory(asset__owner=user, asset__name="exact")
    ScenarioSetFactory(owner=user, name="questions", train_count=8, validation_count=2)
    # Rows only: the form and the dry run's creation read the database, not the stored file.
    for name in ("mail.db", "catalogue.json"):
        DataAttachment.objects.create(
            owner=user, name=name, sha256=hashlib.sha256(name.encode()).hexdigest(), size=2048
        )

    page.goto("/runs/new/")
    page.check('input[name="attachments"][value="mail.db"]')
    with page.context.expect_page() as opened:
        page.click("text=Score the base model's answers")
    form = opened.value
    form.wait_for_load_state()
    assert form.is_checked('input[name="attachments"][value="mail.db"]')
    assert not form.is_checked('input[name="attachments"][value="catalogue.json"]')

    form.click("main form button[type=submit]")
    form.wait_for_url("**/dry-runs/*/")
    assert DryRun.objects.get().attachments == ["mail.db"]
    assert "data: /data/mail.db" in " ".join(form.inner_text("main").split())
    assert_no_console_errors(page)
