"""What every handler of the service shares: ``ApiError``, ``BaseHandler`` (identity, JSON
bodies and answers, errors) and the catch-all ``NotFoundHandler``.

Order of checks in every handler: identity (403), the object exists (404), authority (403),
then the body (400); a refused request changes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote_to_bytes

from sqlalchemy.exc import DBAPIError, InterfaceError, InternalError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from tornado import web

from jupyter_gpubudget.core.accounts import AccountTree
from jupyter_gpubudget.launcher.policy import bad_text
from jupyter_gpubudget.ledger import LedgerError
from jupyter_gpubudget.ledger.store import STATES as LEDGER_STATES

from .auth import Caller, Denied
from .leader import NotLeader
from .validate import Invalid, check_strings

if TYPE_CHECKING:
    from .app import GpuBudgetService

STATES = set(LEDGER_STATES)
T = TypeVar("T")

#: what a busy, locked, read-only or unreachable ledger raises: answered 503 + Retry-After
LEDGER_DOWN = (OperationalError, InterfaceError, PoolTimeout)
#: what a write whose transaction the database ended raises besides: PostgreSQL's
#: ``idle_in_transaction_session_timeout`` and ``in_failed_sql_transaction`` are class 25
#: (invalid transaction state), which the driver reports as an internal error
TX_ENDED = (*LEDGER_DOWN, InternalError)


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None,
                 retry_after: int | None = None, extra: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field
        self.retry_after = retry_after
        self.extra = extra or {}


#: methods that never change anything: a standby replica answers them itself
READ_METHODS = ("GET", "HEAD", "OPTIONS")


def not_leader_error(e: NotLeader) -> ApiError:
    """A write sent to a standby replica (or to one that just lost the lease): 503 +
    ``{"error": "not_leader", "leader": URL or null}``; clients retry at the leader."""
    return ApiError(503, e.message, retry_after=1,
                    extra={"error": "not_leader", "leader": e.leader})


@web.stream_request_body
class BaseHandler(web.RequestHandler):
    """Token-authenticated requests need no XSRF token; a state change authenticated by the
    OAuth cookie must carry JupyterHub's (``X-XSRFToken`` header or ``?_xsrf=``, from the
    ``_xsrf`` cookie): ``HubOAuth`` applies JupyterHub's check before it accepts the cookie,
    so a forged cross-site request is simply unauthenticated (403).

    Bodies are streamed in and kept only up to ``GpuBudgetService.max_body_bytes``; a larger
    body is answered 413 (read to its end, so the client gets the answer)."""

    svc: GpuBudgetService

    def initialize(self, svc: GpuBudgetService) -> None:
        self.svc = svc
        self.hub_auth = svc.hub_auth
        self._chunks: list[bytes] = []
        self._size = 0
        self._caller: Caller | None = None

    def prepare(self) -> None:
        """A path with a malformed %-escape is a 400 before anything else; a standby replica
        refuses writes before reading their bodies (503 not_leader, naming the leader); the
        ledger's fence refuses any write that slips past."""
        check_path_escapes(self.request.path)
        if self.request.method not in READ_METHODS and not self.svc.is_leader:
            raise not_leader_error(self.svc.not_leader())

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= self.svc.max_body_bytes:
            self._chunks.append(chunk)
        else:
            self._chunks = []

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        out = super().decode_argument(value, name)
        why = bad_text(out)
        if why:
            field = name or "path"
            raise ApiError(400, f"{field}: {why}", field)
        return out

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    # ---------------------------------------------------------------- errors
    def write_error(self, status_code: int, **kw: Any) -> None:
        exc = kw.get("exc_info", (None, None, None))[1]
        body: dict[str, Any] = {"status": status_code}
        if isinstance(exc, ApiError):
            body["message"] = exc.message
            if exc.field:
                body["field"] = exc.field
            body.update(exc.extra)
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            body["message"] = exc.log_message % exc.args if exc.args else exc.log_message
        else:
            body["message"] = self._reason
        self.finish(json.dumps(body))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, Denied):
            e = ApiError(403, e.reason)
        elif isinstance(e, Invalid):
            e = ApiError(400, f"{e.field}: {e.message}", e.field)
        elif isinstance(e, LedgerError):
            e = ApiError(e.status, e.message, e.field)
        elif isinstance(e, NotLeader):
            e = not_leader_error(e)
        if isinstance(e, ApiError):
            if self._finished:
                return
            self.clear()
            self.set_status(e.status)
            self.set_default_headers()
            if e.retry_after is not None:
                self.set_header("Retry-After", str(e.retry_after))
            self.write_error(e.status, exc_info=(type(e), e, None))
            return
        super()._handle_request_exception(e)

    # ---------------------------------------------------------------- the ledger
    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` — anything that touches the ledger — on the service's database
        threads, never on the event loop; a busy, read-only or unreachable ledger becomes
        ``503 {"message": "ledger unavailable: ..."}`` with ``Retry-After`` (health shows it).

        In a write (any method but GET, HEAD, OPTIONS) a database error is what a paused
        leader meets when it wakes up: the database ended its transaction (nothing of it was
        committed) and another replica may lead by now. Every write handler answers it 503, as
        a write to a standby is: ``not_leader`` (naming the leader) when this replica no longer
        leads, else ``ledger unavailable``; a client retries either way. Any other database
        error of a replica that still leads is a fault of ours (500)."""
        generation = self.svc.ledger.generation
        try:
            out = await asyncio.get_running_loop().run_in_executor(self.svc.db_pool, fn, *args)
        except (*LEDGER_DOWN, DBAPIError) as e:
            raise self.ledger_error(e) from None
        if self.svc.ledger.generation != generation:  # a write went through: writable again
            self.svc.ledger_ok()
        return out

    def ledger_error(self, e: Exception) -> Exception:
        """What :meth:`db` answers for a database error ``e`` (see there)."""
        write = self.request.method not in READ_METHODS
        if write and not self.svc.is_leader:
            return not_leader_error(self.svc.not_leader())
        ended = e.connection_invalidated if isinstance(e, DBAPIError) else False
        if not isinstance(e, TX_ENDED if write else LEDGER_DOWN) and not ended:
            return e
        reason = str(getattr(e, "orig", None) or e).splitlines()[0][:300]
        self.svc.ledger_failed(reason)
        return ApiError(503, f"ledger unavailable: {reason}", retry_after=5)

    # ---------------------------------------------------------------- helpers
    async def caller(self) -> Caller:
        """Who is calling (asked once per request: ``needs_scope`` and the handler share it)."""
        if self._caller is None:
            self._caller = await self._identify()
        return self._caller

    async def _identify(self) -> Caller:
        if self.svc.local_tokens is not None:  # no JupyterHub: the tokens file decides
            return self.local_caller()
        try:
            model = await self.svc.hub_auth.get_user(self, sync=False)
        except web.HTTPError as e:
            if e.status_code < 500:
                raise
            raise ApiError(503, "JupyterHub cannot confirm the token right now; retry") from None
        if not model:
            raise ApiError(403, "missing, invalid or expired token")
        return Caller.from_hub_model(model, self.svc.service_name)

    def local_caller(self) -> Caller:
        auth = self.request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() in ("token", "bearer") and token:
            for known, ident in self.svc.local_tokens.items():
                if hmac.compare_digest(known.encode(), token.strip().encode()):
                    return Caller.from_hub_model(ident, self.svc.service_name)
        raise ApiError(403, "missing, invalid or expired token")

    def body(self) -> Any:
        limit = self.svc.max_body_bytes
        if self._size > limit:
            raise ApiError(413, f"body: {self._size} bytes; at most {limit} bytes are accepted",
                           "body")
        raw = b"".join(self._chunks)
        try:
            obj = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"body: not valid JSON ({e})", "body") from None
        except RecursionError:
            raise ApiError(400, "body: JSON nested too deeply", "body") from None
        check_strings(obj)
        return obj

    def send(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(obj, allow_nan=False))

    def idempotent(self, key: str, apply: Callable[[Any], tuple[int, dict]],
                   now: float) -> tuple[int, dict]:
        """Apply once per Idempotency-Key (on the database threads); a retry with the same key
        and the same body gets the first answer, one with another body is refused (422)."""
        digest = hashlib.sha256(b"".join(self._chunks)).hexdigest()  # the body as streamed in
        status, body, _ = self.svc.ledger.idempotent(key, apply, now, fingerprint=digest)
        return status, body

    def idem_key(self, caller: Caller) -> str | None:
        key = self.request.headers.get("Idempotency-Key")
        if key is None:
            return None
        if not 1 <= len(key) <= 200:
            raise ApiError(400, "Idempotency-Key: 1..200 characters", "Idempotency-Key")
        return f"{caller.name}:{self.request.path}:{key}"

    @property
    def tree(self) -> AccountTree:
        return self.svc.tree()

    def account_or_404(self, name: str) -> None:
        if name not in self.tree:
            raise ApiError(404, f"no account {name!r}")

    def query_states(self) -> tuple[str, ...] | None:
        raw = self.get_query_argument("state", None)
        if raw is None:
            return None
        states = tuple(s for s in raw.split(",") if s)
        bad = [s for s in states if s not in STATES]
        if bad or not states:
            raise ApiError(400, f"state: unknown state {bad[0] if bad else raw!r} "
                                f"(one of {', '.join(sorted(STATES))})", "state")
        return states


_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def check_path_escapes(path: str) -> None:
    """A request path whose %-escapes are malformed (``%zz``, a cut ``%E0%A4%A``) or do not
    decode to UTF-8 (``%C0%AF``) is a 400 naming the path, on every route (the 404 route
    too), before identity or routing look at it."""
    bad = _ESCAPE.search(path)
    if bad is None:
        try:
            unquote_to_bytes(path).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "path: its %-escapes do not decode to UTF-8", "path") from None
        return
    raise ApiError(400, f"path: malformed %-escape {path[bad.start():bad.start() + 3]!r} "
                        "(a % must be followed by two hex digits)", "path")


class NotFoundHandler(BaseHandler):
    def prepare(self) -> None:
        check_path_escapes(self.request.path)
        raise ApiError(404, f"no such endpoint {self.request.path}")
