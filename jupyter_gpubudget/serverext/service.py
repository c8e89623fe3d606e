"""Calls from the user's Jupyter server to the gpubudget service, with the server's token."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .config import GpuBudgetLab

# optional endpoints: the sidebar shows their sections only when the service has them
FEATURE_PATHS = {
    "usage_daily": "/accounts/{}/usage/daily",
    "job_log": "/jobs/{}/log",
    "session_history": "/sessions/{}/history",
    "my_week": "/me/week",
    "budget_requests": "/budget-requests",
}


class ServiceUnavailable(Exception):
    """The service is not configured, not reachable, or answered something unreadable."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Answer:
    status: int
    body: Any  # parsed JSON


def _shape(path: str) -> str:
    """``/accounts/{name}/usage`` -> ``/accounts/{}/usage``: compare paths, not param names."""
    out, depth = [], 0
    for ch in path:
        if ch == "{":
            depth += 1
            if depth == 1:
                out.append("{}")
        elif ch == "}":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


@dataclass
class ServiceClient:
    lab: GpuBudgetLab
    _features: dict[str, bool] = field(default_factory=dict)
    _features_at: float = 0.0
    _features_error: str | None = None
    _checked_at: float = 0.0
    _answered: int = 0  # the replica (index in service_urls) that answered last

    async def call(self, method: str, path: str, query: str = "", body: Any = None) -> Answer:
        """One request to the service; with several replicas (``service_url`` lists them),
        the one that answered last first, the next on a connection failure or a standby's
        ``not_leader``."""
        problem = self.lab.problem()
        if problem:
            raise ServiceUnavailable(503, f"not connected to a gpubudget service: {problem}")
        urls = self.lab.service_urls()
        first = self._answered % len(urls)
        err: ServiceUnavailable | None = None
        answer: Answer | None = None
        for i, base in enumerate(urls[first:] + urls[:first]):
            try:
                answer = await self._call(base, method, path, query, body)
            except ServiceUnavailable as e:
                err = e
                continue
            if answer.status == 503 and isinstance(answer.body, dict) \
                    and answer.body.get("error") == "not_leader":
                continue
            self._answered = (first + i) % len(urls)
            return answer
        if answer is not None:
            return answer  # every replica a standby: their answer says so
        assert err is not None
        raise err

    async def _call(self, base: str, method: str, path: str, query: str,
                    body: Any) -> Answer:
        url = self.lab.api_url(path, base) + (f"?{query}" if query else "")
        headers = {"Authorization": f"token {self.lab.api_token}", "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body)
        elif method in ("POST", "PUT"):
            data = ""
        req = HTTPRequest(url, method=method, headers=headers, body=data,
                          request_timeout=self.lab.request_timeout, follow_redirects=False,
                          allow_nonstandard_methods=True)
        try:
            r = await AsyncHTTPClient().fetch(req, raise_error=False)
        except (OSError, HTTPClientError) as e:
            raise ServiceUnavailable(502, f"the gpubudget service at {base} "
                                          f"cannot be reached: {e}") from None
        if r.code == 599:  # tornado: connection refused, timeout, DNS ...
            raise ServiceUnavailable(502, f"the gpubudget service at {base} "
                                          f"cannot be reached: {r.error}")
        try:
            body = json.loads(r.body or b"null")
        except ValueError:
            raise ServiceUnavailable(502, f"the gpubudget service at {base} "
                                          f"answered {r.code} with something other than "
                                          "JSON: is the URL right? (set $GPUBUDGET_URL or "
                                          "GpuBudgetLab.service_url)") from None
        return Answer(r.code, body)

    async def features(self) -> tuple[dict[str, bool], str | None]:
        """Which optional endpoints the service has (from its OpenAPI document), and why the
        service could not be asked (None when it answered)."""
        now = time.monotonic()
        fresh = now - self._features_at < self.lab.features_ttl and self._features_error is None
        if fresh or (self._features_error is not None and now - self._checked_at < 5.0):
            return dict(self._features), self._features_error
        self._checked_at = now
        try:
            a = await self.call("GET", "openapi.json")
            if a.status != 200 or not isinstance(a.body, dict):
                raise ServiceUnavailable(502, f"the gpubudget service at "
                                              f"{self.lab.service_url} answered {a.status} "
                                              "for its API document")
            paths = {_shape(p) for p in (a.body.get("paths") or {})}
            self._features = {k: v in paths for k, v in FEATURE_PATHS.items()}
            self._features["snapshots"] = any(p.startswith("/snapshots") or "/snapshot" in p
                                              for p in paths)
            self._features_at, self._features_error = now, None
        except ServiceUnavailable as e:
            self._features_error = e.message
        return dict(self._features), self._features_error
