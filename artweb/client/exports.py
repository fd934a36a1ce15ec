"""Export targets: where a run's steps are sent (W&B, Weave, Langfuse)."""

from __future__ import annotations

from typing import Any

from artweb.client.session import Session


class ExportsApi(Session):
    """Your export targets."""

    # --- export targets (W&B, Weave, Langfuse) ----------------------------------------------------

    def export_targets(self, *, run: int | None = None) -> list[dict]:
        """Your export targets; run: only that run's."""
        return self._get("/export-targets/", run=run)["results"]

    def export_target_kinds(self) -> list[dict]:
        """Each kind with the JSON Schema of its settings."""
        return self._get("/export-targets/kinds/")["results"]

    def export_target(self, target_id: int) -> dict:
        return self._get(f"/export-targets/{target_id}/")

    def export_target_create(
        self, *, kind: str, settings: dict | None = None, secret: str = "", run: int | None = None, enabled: bool = True
    ) -> dict:
        """kind: wandb, weave or langfuse; run None: all your runs. The secret is never sent back."""
        return self._post(
            "/export-targets/create/",
            {"kind": kind, "settings": settings or {}, "secret": secret, "run": run, "enabled": enabled},
        )

    def export_target_update(
        self, target_id: int, *, settings: dict | None = None, secret: str | None = None, enabled: bool | None = None
    ) -> dict:
        """Only what is given changes: settings (whole), secret ("" removes the stored one), enabled."""
        payload: dict[str, Any] = {}
        if settings is not None:
            payload["settings"] = settings
        if secret is not None:
            payload["secret"] = secret
        if enabled is not None:
            payload["enabled"] = enabled
        return self._post(f"/export-targets/{target_id}/update/", payload)

    def export_target_test(self, target_id: int) -> dict:
        """Send one test event; {"ok": bool, "message": what the service said, "target": {...}}."""
        return self._post(f"/export-targets/{target_id}/test/")

    def export_target_delete(self, target_id: int) -> dict:
        return self._post(f"/export-targets/{target_id}/delete/")
