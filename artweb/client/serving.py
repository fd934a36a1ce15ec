"""Serving: the OpenAI-compatible endpoint, checkpoint aliases, the playground and answer diffs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

from artweb.client.session import Session, raise_for


class ServingApi(Session):
    """Chat with base models and checkpoints, name checkpoints, compare answers."""

    # --- serving: the OpenAI-compatible endpoint, aliases, playground, answer diffs ------------------

    def served_models(self) -> list[dict]:
        """Every name `chat` takes: base models, <run>@<step|best|latest>, your aliases."""
        return self._get("/openai/models")["data"]

    def chat(self, model: str, messages: list[dict], **params) -> dict:
        """One chat completion (OpenAI's request fields in params: max_tokens, tools, logprobs, ...)."""
        return self._post("/openai/chat/completions", {**params, "model": model, "messages": messages, "stream": False})

    def chat_stream(self, model: str, messages: list[dict], **params) -> Iterator[dict]:
        """The same, streamed: yields each chunk (OpenAI's chat.completion.chunk objects) as it arrives."""
        body = {**params, "model": model, "messages": messages, "stream": True}
        with self._http.stream("POST", "/openai/chat/completions", json=body, timeout=None) as response:
            if response.status_code >= 400:
                response.read()
                raise_for(response)
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
        raise_for(response)
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
