"""The connection every part of the client shares: the HTTP session, its error type and the paging."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

DEFAULT_TIMEOUT = 60.0


class ApiError(Exception):
    def __init__(self, status: int, message: str, field_errors: dict | None = None):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.field_errors = field_errors or {}


class Session:
    """An authenticated session on the API's /api/v1 routes; the client's parts build on it."""

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

    # --- requests and pages ---------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs) -> Any:
        response = self._http.request(method, path, **kwargs)
        raise_for(response)
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

    def _cursor_pages(self, path: str, **params) -> Iterator[dict]:
        cursor = None
        while True:
            page = self._get(path, cursor=cursor, **params)
            yield from page["results"]
            cursor = page.get("next_cursor")
            if not cursor:
                return


def raise_for(response: httpx.Response) -> None:
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
