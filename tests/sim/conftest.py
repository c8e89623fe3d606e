from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED.exists():
        pytest.skip(f"shared traces not present at {SHARED}")
    return SHARED
