from tests.fixtures.postgres import db_url, postgres_server  # noqa: F401
