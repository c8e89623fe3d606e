"""Engines and migrations. SQLite runs in WAL mode with foreign keys on; PostgreSQL via psycopg 3."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import NullPool, QueuePool

MIGRATIONS = Path(__file__).parent / "migrations"


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` and pick the psycopg 3 driver; accept a bare path for SQLite."""
    if "://" not in url:
        return f"sqlite:///{Path(url).absolute()}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


#: PostgreSQL connections: a database that stops answering is noticed within seconds (not
#: the kernel's TCP timeouts of minutes), and a transaction left open by a paused process
#: (SIGSTOP, a partition) is ended by the server, releasing its locks — a replica taking
#: over the lease waits for nothing longer than that
PG_CONNECT_ARGS = {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 5,
                   "keepalives_interval": 1, "keepalives_count": 3, "tcp_user_timeout": 5000,
                   "options": "-c idle_in_transaction_session_timeout=5000"}


def connect(url: str, *, sqlite_synchronous: str = "FULL", read_only: bool = False,
            busy_timeout: float = 30.0, pool_size: int = 5) -> Engine:
    """An engine for the ledger. ``read_only`` (SQLite): transactions begin deferred, so
    readers never queue behind the writer's lock (WAL readers see the last commit).
    ``busy_timeout``: seconds a SQLite writer waits for the lock before failing.
    ``pool_size``: PostgreSQL connections kept (as many again may open under load)."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": busy_timeout,
                                                  "check_same_thread": False},
                               poolclass=NullPool if ":memory:" in url else QueuePool,
                               pool_size=8, max_overflow=8)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001
            # autocommit off during the pragmas is not needed: they are not transactional
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={sqlite_synchronous}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            cur.close()

        # pysqlite's own transaction handling defers BEGIN; emit BEGIN IMMEDIATE ourselves so a
        # writer takes the lock up front and two writers never interleave read-then-write.
        @event.listens_for(engine, "connect")
        def _no_auto_begin(dbapi_conn, _record):  # noqa: ANN001
            dbapi_conn.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin(conn):  # noqa: ANN001
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=pool_size,
                         connect_args=dict(PG_CONNECT_ARGS) if "+psycopg" in url else {})


def alembic_config(url: str):  # noqa: ANN201
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations up to ``revision`` (the service does this on start)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    """The newest migration shipped with this package."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
