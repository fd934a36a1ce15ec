"""Runs: start, act on, read their metrics, events, logs and trajectories, and follow one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from artweb.client.session import Session, raise_for


class RunsApi(Session):
    """Runs and what they record."""

    # --- runs -------------------------------------------------------------------------------------

    def runs(
        self,
        *,
        status: str | None = None,
        tag: str | None = None,
        q: str | None = None,
        base_model: str | None = None,
        order: str | None = None,
        limit: int | None = None,
    ) -> list[dict]:
        """Your runs matching the filters, newest first (or by `order`); at most `limit` of them, else all."""
        found: list[dict] = []
        filters = {"status": status, "tag": tag, "q": q, "base_model": base_model, "order": order}
        for run in self._pages("/runs/", **filters):
            if limit is not None and len(found) >= limit:
                break
            found.append(run)
        return found

    def runs_count(self, *, status: str | None = None, tag: str | None = None, q: str | None = None) -> int:
        """How many of your runs match the filters."""
        return int(self._get("/runs/", status=status, tag=tag, q=q, limit=1)["count"])

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

    def events(self, run_id: int, *, after: int = 0) -> list[dict]:
        """The run's timeline, oldest first: every event after the event id `after` (0: all of it). Poll
        for new ones with after=<the last one's "id">."""
        return list(self._after_pages(f"/runs/{run_id}/events/", after))

    def logs(self, run_id: int, *, after: int = 0) -> list[dict]:
        """The run's worker log lines, oldest first, after the line id `after` (as events)."""
        return list(self._after_pages(f"/runs/{run_id}/logs/", after))

    def _after_pages(self, path: str, after: int) -> Iterator[dict]:
        while True:
            page = self._get(path, after=after, limit=1000)
            yield from page["results"]
            if not page["results"]:
                return
            after = page["next_after"]

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

    def trajectories_export(self, run_id: int, out: str | Path, **filters) -> int:
        """Stream the run's trajectories as JSONL into out; returns the bytes written."""
        params = {k: v for k, v in filters.items() if v is not None}
        written = 0
        tmp = Path(str(out) + ".partial")
        with self._http.stream("GET", f"/runs/{run_id}/trajectories/export/", params=params) as response:
            if response.status_code >= 400:
                response.read()
                raise_for(response)
            with tmp.open("wb") as fh:
                for chunk in response.iter_bytes():
                    fh.write(chunk)
                    written += len(chunk)
        tmp.replace(out)
        return written

    # --- following a run --------------------------------------------------------------------------

    def metrics_follow(
        self, run_id: int, *, series: list[str] | None = None, interval: float = 2.0, timeout: float | None = None
    ) -> Iterator[tuple[dict, dict]]:
        """Yield (run, new_metrics) each poll until the run is finished (or paused), using the since cursor.

        A client-driven run ("driver": "client") waits for its ART client between steps and never finishes
        by itself: it is followed through "waiting" until the timeout, or until it is paused or stopped."""
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
