"""The spawner's HTTP client for the gpubudget service (reached directly from the hub)."""

from __future__ import annotations

import json
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest


class _Next(Exception):
    """This replica cannot answer (unreachable, standby): try the next one."""

    def __init__(self, error: ServiceError) -> None:
        super().__init__(error.message)
        self.error = error


class ServiceError(Exception):
    """The service refused (``status`` < 500) or could not be reached / failed (>= 500)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def split_urls(urls: str) -> list[str]:
    """``"http://a/x, http://b/x"`` -> both, without trailing slashes (replicas of the
    service: one leads, the others stand by)."""
    return [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]


#: the URL list -> the index of the replica that answered last (tried first next time)
_answered: dict[tuple[str, ...], int] = {}


def is_not_leader(code: int, data: Any) -> bool:
    """A standby replica's answer to a write: try the next replica."""
    return code == 503 and isinstance(data, dict) and data.get("error") == "not_leader"


class ServiceClient:
    """JSON over HTTP with the spawner's service token. ``base_url`` may list several
    replicas of the service, comma-separated: the one that answered last is tried first,
    the next on a connection failure or a standby's ``not_leader``."""

    def __init__(self, base_url: str, token: str, timeout: float) -> None:
        self.urls = tuple(split_urls(base_url)) or (base_url.rstrip("/"),)
        self.base_url = self.urls[0]
        self.token = token
        self.timeout = timeout

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict | None = None) -> dict:
        first = _answered.get(self.urls, 0) % len(self.urls)
        order = self.urls[first:] + self.urls[:first]
        err: ServiceError | None = None
        for i, url in enumerate(order):
            self.base_url = url
            try:
                out = await self._request(method, path, body, headers)
            except _Next as e:
                err = e.error
                continue
            _answered[self.urls] = (first + i) % len(self.urls)
            return out
        assert err is not None
        raise err

    async def _request(self, method: str, path: str, body: Any = None,
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
            raise _Next(ServiceError(503, f"the gpubudget service is unreachable ({e})")) from e
        try:
            data = json.loads(resp.body or b"{}")
        except ValueError:
            data = {"message": (resp.body or b"").decode(errors="replace")[:300]}
        if resp.code == 599 or is_not_leader(resp.code, data):
            msg = data.get("message") or str(resp.error)
            raise _Next(ServiceError(503, f"gpubudget service: {msg}"))
        if resp.code >= 400:
            msg = data.get("message") or resp.reason or str(resp.error)
            raise ServiceError(resp.code if resp.code != 599 else 503,
                               f"gpubudget service: {msg}")
        return data
