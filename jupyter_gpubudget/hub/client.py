"""The spawner's HTTP client for the gpubudget service (reached directly from the hub)."""

from __future__ import annotations

import json
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest


class ServiceError(Exception):
    """The service refused (``status`` < 500) or could not be reached / failed (>= 500)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class ServiceClient:
    """JSON over HTTP with the spawner's service token."""

    def __init__(self, base_url: str, token: str, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict | None = None) -> dict:
        hdrs = {"Authorization": f"token {self.token}", "Accept": "application/json"}
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        req = HTTPRequest(self.base_url + path, method=method, headers=hdrs,
                          body=json.dumps(body) if body is not None else
                          (b"" if method == "POST" else None),
                          request_timeout=self.timeout)
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except Exception as e:  # connection refused, DNS
            raise ServiceError(503, f"the gpubudget service is unreachable ({e})") from e
        try:
            data = json.loads(resp.body or b"{}")
        except ValueError:
            data = {"message": (resp.body or b"").decode(errors="replace")[:300]}
        if resp.code >= 400 or resp.code == 599:
            msg = data.get("message") or resp.reason or str(resp.error)
            raise ServiceError(resp.code if resp.code != 599 else 503,
                               f"gpubudget service: {msg}")
        return data
