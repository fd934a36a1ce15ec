"""Tokens, base models, uploaded code, scenario sets, data attachments, dry runs and checkpoints."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from artweb.client.bundle import zip_directory
from artweb.client.session import DEFAULT_TIMEOUT, Session, raise_for


class ResourcesApi(Session):
    """What a run is made of, and what it leaves behind."""

    # --- tokens -----------------------------------------------------------------------------------

    @classmethod
    def token_create(
        cls,
        base_url: str,
        username: str,
        password: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> str:
        """Create (or replace) the user's API token with username and password; returns the key."""
        with httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1", auth=(username, password), timeout=timeout, transport=transport
        ) as http:
            response = http.post("/tokens/")
            raise_for(response)
            return response.json()["key"]

    def token_revoke(self) -> bool:
        return self._post("/tokens/revoke/")["revoked"]

    # --- base models ------------------------------------------------------------------------------

    def base_models(self) -> list[dict]:
        return list(self._pages("/base-models/"))

    def base_model_register(self, *, name: str, source: str, **fields) -> dict:
        return self._post("/base-models/register/", {"name": name, "source": source, **fields})

    # --- code uploads -----------------------------------------------------------------------------

    def _code_upload(
        self,
        kind: str,
        name: str,
        content: str | bytes,
        *,
        description: str = "",
        note: str = "",
        new_version: bool = True,
        bundle: bool = False,
    ) -> dict:
        """Create the asset, or (new_version) add a version when one of that name exists. bundle: content is
        a zip (a rollout bundle), not source."""
        existing = self._by_name(f"/{kind}/", name) if new_version else None
        raw = content if isinstance(content, bytes) else content.encode("utf-8")
        files = {"file": (f"{name}.zip", raw, "application/zip") if bundle else (f"{name}.py", raw, "text/x-python")}
        if existing:
            return self._post(f"/{kind}/{existing['id']}/versions/create/", data={"note": note}, files=files)
        return self._post(f"/{kind}/create/", data={"name": name, "description": description}, files=files)

    def script_upload(self, name: str, content: str | bytes, **kwargs) -> dict:
        return self._code_upload("scripts", name, content, **kwargs)

    def script_bundle_upload(self, name: str, folder_or_zip: str | Path | bytes, **kwargs) -> dict:
        """Upload a rollout bundle: a folder (zipped here) with rollout.py at its top, or a zip's bytes."""
        raw = folder_or_zip if isinstance(folder_or_zip, bytes) else zip_directory(folder_or_zip)
        return self._code_upload("scripts", name, raw, bundle=True, **kwargs)

    def reward_upload(self, name: str, content: str | bytes, **kwargs) -> dict:
        return self._code_upload("rewards", name, content, **kwargs)

    def script_validate(self, content: str) -> dict:
        return self._post("/scripts/validate/", {"content": content})

    def script_bundle_validate(self, folder_or_zip: str | Path | bytes) -> dict:
        """Check a rollout bundle (a folder, zipped here, or a zip's bytes) without saving it."""
        raw = folder_or_zip if isinstance(folder_or_zip, bytes) else zip_directory(folder_or_zip)
        return self._post("/scripts/validate/", files={"file": ("bundle.zip", raw, "application/zip")})

    def reward_validate(self, content: str) -> dict:
        return self._post("/rewards/validate/", {"content": content})

    def scripts(self) -> list[dict]:
        return list(self._pages("/scripts/"))

    def rewards(self) -> list[dict]:
        return list(self._pages("/rewards/"))

    def script_versions(self, script_id: int) -> list[dict]:
        return list(self._pages(f"/scripts/{script_id}/versions/"))

    def script_version(self, script_id: int, number: int) -> dict:
        return self._get(f"/scripts/{script_id}/versions/{number}/")

    def reward_version(self, reward_id: int, number: int) -> dict:
        return self._get(f"/rewards/{reward_id}/versions/{number}/")

    # --- scenario sets ----------------------------------------------------------------------------

    def scenarios_upload(
        self, name: str, jsonl: str | bytes, *, validation_fraction: float = 0.2, description: str = ""
    ) -> dict:
        raw = jsonl if isinstance(jsonl, bytes) else jsonl.encode("utf-8")
        return self._post(
            "/scenario-sets/create/",
            data={"name": name, "description": description, "validation_fraction": str(validation_fraction)},
            files={"file": (f"{name}.jsonl", raw, "application/x-ndjson")},
        )

    def scenario_sets(self) -> list[dict]:
        return list(self._pages("/scenario-sets/"))

    def scenario_set(self, scenario_set_id: int) -> dict:
        return self._get(f"/scenario-sets/{scenario_set_id}/")

    def scenarios(self, scenario_set_id: int, *, split: str | None = None) -> list[dict]:
        return list(self._pages(f"/scenario-sets/{scenario_set_id}/scenarios/", split=split))

    # --- data attachments -------------------------------------------------------------------------

    def attachment_upload(self, path: str | Path, *, name: str | None = None, description: str = "") -> dict:
        """Upload a file as a data attachment (runs read it at /data/<name>), streamed from disk; name: the
        file's own when None. The same file under the same name again returns the attachment already there."""
        path = Path(path)
        with open(path, "rb") as f:
            # No timeout: a file of gigabytes takes its time to send, and the server hashes it before answering.
            return self._post(
                "/attachments/create/",
                data={"name": name or path.name, "description": description},
                files={"file": (path.name, f, "application/octet-stream")},
                timeout=None,
            )

    def attachments(self) -> list[dict]:
        return list(self._pages("/attachments/"))

    def attachment_delete(self, attachment_id: int) -> None:
        """Delete an attachment (refused while a run that is not finished uses it)."""
        self._post(f"/attachments/{attachment_id}/delete/")

    # --- dry runs ---------------------------------------------------------------------------------

    def dry_run_create(self, **fields) -> dict:
        return self._post("/dry-runs/create/", fields)

    def dry_run(self, dry_run_id: int) -> dict:
        return self._get(f"/dry-runs/{dry_run_id}/")

    def dry_run_wait(self, dry_run_id: int, *, timeout: float = 600, interval: float = 1.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            dry_run = self.dry_run(dry_run_id)
            if dry_run["status"] in ("done", "failed") or time.monotonic() > deadline:
                return dry_run
            time.sleep(interval)

    # --- checkpoints ------------------------------------------------------------------------------

    def checkpoints(self, run_id: int) -> list[dict]:
        return self._get(f"/runs/{run_id}/checkpoints/")["results"]

    def checkpoint_promote(self, checkpoint_id: int) -> dict:
        return self._post(f"/checkpoints/{checkpoint_id}/promote/")

    def checkpoint_delete(self, checkpoint_id: int) -> dict:
        return self._post(f"/checkpoints/{checkpoint_id}/delete/")

    def checkpoint_download(self, checkpoint_id: int, out: str | Path, *, progress=None) -> int:
        """Save the checkpoint's .tar.gz to out; progress(done_bytes, total_bytes|None) is called per chunk."""
        written = 0
        tmp = Path(str(out) + ".partial")
        with self._http.stream("GET", f"/checkpoints/{checkpoint_id}/download/") as response:
            if response.status_code >= 400:
                response.read()
                raise_for(response)
            total = int(response.headers["Content-Length"]) if "Content-Length" in response.headers else None
            with tmp.open("wb") as fh:
                for chunk in response.iter_bytes():
                    fh.write(chunk)
                    written += len(chunk)
                    if progress:
                        progress(written, total)
        tmp.replace(out)
        return written
