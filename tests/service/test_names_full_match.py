"""Names checked with a whole-string match: ``re.match`` with a ``$``-anchored pattern lets a
trailing newline through (``$`` matches before it), so each of these checks uses ``fullmatch``
and refuses ``name\\n`` — a launcher config's variable names, a report's time zone, a snapshot's
session and snapshot ids (the single store and the sets)."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.launcher.config import LauncherError, make_config
from jupyter_gpubudget.service.base import ApiError
from jupyter_gpubudget.service.handlers.accounts import time_zone
from jupyter_gpubudget.snapshot import SnapshotError
from jupyter_gpubudget.snapshot.sets import Sets
from jupyter_gpubudget.snapshot.store import Store


def test_a_launcher_config_variable_name_with_a_trailing_newline_is_refused():
    assert make_config("/jobs", {"env": {"LANG": "C"}}).env == {"LANG": "C"}
    with pytest.raises(LauncherError, match="env"):
        make_config("/jobs", {"env": {"LANG\n": "C"}})


def test_a_time_zone_with_a_trailing_newline_is_refused():
    assert str(time_zone("Europe/Berlin")) == "Europe/Berlin"
    with pytest.raises(ApiError) as e:
        time_zone("UTC\n")
    assert e.value.field == "tz"
    assert "is not an IANA time zone name" in e.value.message  # (the name check, not a lookup)


def test_a_session_id_with_a_trailing_newline_is_refused_by_the_store(tmp_path):
    store = Store(str(tmp_path))
    store.begin("s1", "lattice", "namespace")  # (a good one is taken)
    with pytest.raises(SnapshotError) as e:
        store.begin("s1\n", "lattice", "namespace")
    assert e.value.reason == "bad_input"


def test_a_snapshot_id_with_a_trailing_newline_is_not_found(tmp_path):
    store = Store(str(tmp_path))
    sid = "s1--18c0ffee000-abcdef"
    assert store.manifest_path(sid).endswith(f"{sid}.json")
    with pytest.raises(SnapshotError) as e:
        store.manifest_path(sid + "\n")
    assert e.value.reason == "not_found"


def test_set_ids_and_session_ids_with_a_trailing_newline_are_refused_by_the_sets(tmp_path):
    sets = Sets(Store(str(tmp_path)))
    good = sets.new_id("s1")
    assert sets.path(good).endswith(f"{good}.json")
    with pytest.raises(SnapshotError) as e:
        sets.new_id("s1\n")
    assert e.value.reason == "bad_input"
    with pytest.raises(SnapshotError) as e:
        sets.path(good + "\n")
    assert e.value.reason == "not_found"
