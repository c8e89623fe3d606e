from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.fixture
def shared_traces() -> Path:
    """The public traces beside the checkout (../shared/traces). A developer without them
    skips these tests; in CI (CI=true) their absence is a failure, never a silent skip."""
    if not SHARED.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared traces not present at {SHARED}")
        pytest.skip(f"shared traces not present at {SHARED}")
    return SHARED
