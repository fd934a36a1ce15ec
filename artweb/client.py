"""A small Python client for the artweb REST API.

    from artweb.client import Client
    api = Client("http://localhost:8000", token="...")
    version = api.script_upload("my-agent", open("rollout.py").read())
    run = api.run_create(name="first", base_model="SmolLM2-135M-Instruct", script="my-agent",
                         reward="exact-match", scenario_set="questions", config={"num_steps": 10})
    for point in api.metrics_follow(run["id"]): ...

Every method returns the decoded JSON answer; a 4xx/5xx raises ApiError with the server's message
and field errors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

DEFAULT_TIMEOUT = 60.0


class ApiError(Exception):
    def __init__(self, status: int, message: str, field_errors: dict | None = None):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.field_errors = field_errors or {}


class Client:
    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ):
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url + "/api/v1", headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- plumbing ---------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs) -> Any:
        response = self._http.request(method, path, **kwargs)
        _raise_for(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def _get(self, path: str, **params) -> Any:
        return self._request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def _post(self, path: str, json: Any = None, **kwargs) -> Any:
        return self._request("POST", path, json=json, **kwargs)

    def _pages(self, path: str, **params) -> Iterator[dict]:
        """Every row of a limit/offset-paged list."""
        offset, limit = 0, 200
        while True:
            page = self._get(path, limit=limit, offset=offset, **params)
            yield from page["results"]
            offset += len(page["results"])
            if not page.get("next") or not page["results"]:
                return

    def _by_name(self, path: str, name: str) -> dict | None:
        results = self._get(path, name=name)["results"]
        return results[0] if results else None

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
            _raise_for(response)
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
    ) -> dict:
        """Create the asset, or (new_version) add a version when one of that name exists."""
        existing = self._by_name(f"/{kind}/", name) if new_version else None
        files = {
            "file": (f"{name}.py", content if isinstance(content, bytes) else content.encode("utf-8"), "text/x-python")
        }
        if existing:
            return self._post(f"/{kind}/{existing['id']}/versions/create/", data={"note": note}, files=files)
        return self._post(f"/{kind}/create/", data={"name": name, "description": description}, files=files)

    def script_upload(self, name: str, content: str | bytes, **kwargs) -> dict:
        return self._code_upload("scripts", name, content, **kwargs)

    def reward_upload(self, name: str, content: str | bytes, **kwargs) -> dict:
        return self._code_upload("rewards", name, content, **kwargs)

    def script_validate(self, content: str) -> dict:
        return self._post("/scripts/validate/", {"content": content})

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

    # --- runs -------------------------------------------------------------------------------------

    def runs(
        self,
        *,
        status: str | None = None,
        tag: str | None = None,
        q: str | None = None,
        base_model: str | None = None,
        order: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> dict:
        return self._get(
            "/runs/", status=status, tag=tag, q=q, base_model=base_model, order=order, limit=limit, offset=offset
        )

    def run(self, run_id: int) -> dict:
        return self._get(f"/runs/{run_id}/")

    def run_create(
        self,
        *,
        name: str,
        base_model: int | str,
        script: int | str,
        scenario_set: int | str,
        reward: int | str | None = None,
        config: dict | None = None,
        tags: list[str] | None = None,
        script_version: int | None = None,
        reward_version: int | None = None,
    ) -> dict:
        payload = {
            "name": name,
            "base_model": base_model,
            "script": script,
            "scenario_set": scenario_set,
            "reward": reward,
            "config": config or {},
            "tags": tags or [],
        }
        if script_version is not None:
            payload["script_version"] = script_version
        if reward_version is not None:
            payload["reward_version"] = reward_version
        return self._post("/runs/create/", payload)

    def run_cancel(self, run_id: int) -> dict:
        return self._post(f"/runs/{run_id}/cancel/")

    def run_pause(self, run_id: int) -> dict:
        return self._post(f"/runs/{run_id}/pause/")

    def run_resume(self, run_id: int) -> dict:
        return self._post(f"/runs/{run_id}/resume/")

    def run_retry(self, run_id: int) -> dict:
        return self._post(f"/runs/{run_id}/retry/")

    def quota(self) -> dict:
        """{"quotas": [{"key", "label", "used", "limit", "reached", "source"}]}: your usage against each limit."""
        return self._get("/quota/")

    def metrics(
        self,
        run_id: int,
        *,
        series: list[str] | None = None,
        since_step: int | None = None,
        max_points: int | None = None,
    ) -> dict:
        return self._get(
            f"/runs/{run_id}/metrics/",
            series=",".join(series) if series else None,
            since_step=since_step,
            max_points=max_points,
        )

    def events(self, run_id: int, *, after: int = 0, limit: int = 200) -> dict:
        return self._get(f"/runs/{run_id}/events/", after=after, limit=limit)

    def logs(self, run_id: int, *, after: int = 0, limit: int = 500) -> dict:
        return self._get(f"/runs/{run_id}/logs/", after=after, limit=limit)

    # --- trajectories -----------------------------------------------------------------------------

    def groups(self, run_id: int, **filters) -> Iterator[dict]:
        yield from self._cursor_pages(f"/runs/{run_id}/groups/", **filters)

    def group(self, run_id: int, group_id: int) -> dict:
        return self._get(f"/runs/{run_id}/groups/{group_id}/")

    def trajectories(self, run_id: int, **filters) -> Iterator[dict]:
        """Every trajectory matching the filters (step, split, min_reward, max_reward, q, has_error)."""
        yield from self._cursor_pages(f"/runs/{run_id}/trajectories/", **filters)

    def trajectory(self, run_id: int, trajectory_id: int) -> dict:
        return self._get(f"/runs/{run_id}/trajectories/{trajectory_id}/")

    def _cursor_pages(self, path: str, **params) -> Iterator[dict]:
        cursor = None
        while True:
            page = self._get(path, cursor=cursor, **params)
            yield from page["results"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def trajectories_export(self, run_id: int, out: str | Path, **filters) -> int:
        """Stream the run's trajectories as JSONL into out; returns the bytes written."""
        params = {k: v for k, v in filters.items() if v is not None}
        written = 0
        tmp = Path(str(out) + ".partial")
        with self._http.stream("GET", f"/runs/{run_id}/trajectories/export/", params=params) as response:
            if response.status_code >= 400:
                response.read()
                _raise_for(response)
            with tmp.open("wb") as fh:
                for chunk in response.iter_bytes():
                    fh.write(chunk)
                    written += len(chunk)
        tmp.replace(out)
        return written

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
                _raise_for(response)
            total = int(response.headers["Content-Length"]) if "Content-Length" in response.headers else None
            with tmp.open("wb") as fh:
                for chunk in response.iter_bytes():
                    fh.write(chunk)
                    written += len(chunk)
                    if progress:
                        progress(written, total)
        tmp.replace(out)
        return written

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

    # --- serving: the OpenAI-compatible endpoint, aliases, playground, answer diffs ------------------

    def served_models(self) -> list[dict]:
        """Every name `chat` takes: base models, <run>@<step|best|latest>, your aliases."""
        return self._get("/openai/models")["data"]

    def chat(self, model: str, messages: list[dict], **params) -> dict:
        """One chat completion (OpenAI's request fields in params: max_tokens, tools, logprobs, ...)."""
        return self._post("/openai/chat/completions", {**params, "model": model, "messages": messages, "stream": False})

    def chat_stream(self, model: str, messages: list[dict], **params) -> Iterator[dict]:
        """The same, streamed: yields each chunk (OpenAI's chat.completion.chunk objects) as it arrives."""
        import json

        body = {**params, "model": model, "messages": messages, "stream": True}
        with self._http.stream("POST", "/openai/chat/completions", json=body, timeout=None) as response:
            if response.status_code >= 400:
                response.read()
                _raise_for(response)
            for line in response.iter_lines():
                if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                    yield json.loads(line[6:])

    def checkpoint_alias(self, checkpoint_id: int, alias: str) -> dict:
        """Serve a checkpoint of yours as `alias` (it is promoted)."""
        return self._post(f"/checkpoints/{checkpoint_id}/alias/", {"alias": alias})

    def checkpoint_alias_delete(self, checkpoint_id: int, alias: str) -> None:
        return self._post(f"/checkpoints/{checkpoint_id}/alias/delete/", {"alias": alias})

    def playground_create(self, models: list[str], prompt: str = "", **fields) -> dict:
        return self._post("/playground/create/", {"models": models, "prompt": prompt, **fields})

    def playground(self, job_id: int) -> dict:
        return self._get(f"/playground/{job_id}/")

    def diffs(self) -> list[dict]:
        return self._get("/diffs/")["results"]

    def diff_create(self, model_a: str, model_b: str, *, scenario_set, reward, **fields) -> dict:
        """Queue an answer diff over the set's held-out scenarios (samples, max_scenarios, seed, ... in fields)."""
        body = {"model_a": model_a, "model_b": model_b, "scenario_set": scenario_set, "reward": reward, **fields}
        return self._post("/diffs/create/", body)

    def diff(self, job_id: int) -> dict:
        return self._get(f"/diffs/{job_id}/")

    def diff_scenarios(self, job_id: int) -> Iterator[dict]:
        """Every scenario of a diff, biggest change first."""
        return self._pages(f"/diffs/{job_id}/scenarios/")

    def diff_export(self, job_id: int, out: str | Path, *, as_: str = "json") -> int:
        """Write the diff as JSON or CSV; returns the bytes written."""
        response = self._http.get(f"/diffs/{job_id}/export/", params={"as": as_})
        _raise_for(response)
        Path(out).write_bytes(response.content)
        return len(response.content)

    def job_wait(self, job: dict, *, interval: float = 2.0, timeout: float | None = None) -> dict:
        """Poll a playground session or a diff until it is done or failed."""
        get = self.diff if job["kind"] == "diff" else self.playground
        deadline = time.monotonic() + timeout if timeout else None
        while job["status"] not in ("done", "failed"):
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"{job['kind']} {job['id']} still {job['status']} after {timeout} s")
            time.sleep(interval)
            job = get(job["id"])
        return job

    # --- following a run --------------------------------------------------------------------------

    def metrics_follow(
        self, run_id: int, *, series: list[str] | None = None, interval: float = 2.0, timeout: float | None = None
    ) -> Iterator[tuple[dict, dict]]:
        """Yield (run, new_metrics) each poll until the run is finished (or paused), using the since cursor."""
        since = None
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            run = self.run(run_id)
            data = self.metrics(run_id, series=series, since_step=since)
            if data["last_step"] is not None:
                since = data["last_step"]
            yield run, data
            if run["status"] in ("completed", "failed", "cancelled", "paused"):
                return
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {run['status']} after {timeout} s")
            time.sleep(interval)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        data = response.json()
        if isinstance(data.get("error"), dict):  # the OpenAI-compatible endpoint answers in OpenAI's shape
            data = {"message": data["error"].get("message"), "field_errors": {}}
        message, field_errors = data.get("message") or str(data), data.get("field_errors") or {}
    except ValueError:
        message, field_errors = response.text[:500] or response.reason_phrase, {}
    raise ApiError(response.status_code, message, field_errors)
