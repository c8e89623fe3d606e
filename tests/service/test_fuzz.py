"""Fuzz every operation of the served OpenAPI document (schemathesis, hypothesis underneath)
as an admin, a plain user and without a token: no request gets a 5xx.

The fuzzed service only accepts the command ``true`` (LocalBackend.allowed_commands), so
generated jobs never execute generated shell text."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from jupyter_gpubudget.service.openapi import openapi_document
from tests.fixtures.hub import ServiceProc, http
from tests.service.conftest import cleanup


@pytest.fixture(scope="module")
def fuzz_service(hub, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}", cycle_interval=0.3,
                      extra_args=["--LocalBackend.allowed_commands=true"])
    svc.start()
    yield svc
    cleanup(svc, None)


# the very document the service serves (test_openapi_document_is_served checks they agree)
schema = schemathesis.openapi.from_dict(openapi_document("/services/gpubudget/api/v1"))


def test_openapi_document_is_served(fuzz_service):
    assert http("GET", fuzz_service.api + "/openapi.json")[1] == openapi_document(
        "/services/gpubudget/api/v1")


@schema.parametrize()
@settings(max_examples=25, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case, fuzz_service, tokens):
    for token in (tokens["root"], tokens["bob"], None):
        headers = {"Authorization": f"token {token}"} if token else {}
        response = case.call(base_url=fuzz_service.api, headers=headers)
        assert response.status_code < 500, (case.method, case.formatted_path, case.body,
                                             response.status_code, response.text[:500])
