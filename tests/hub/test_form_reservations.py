"""The spawn form's reservations (hub/form.py): which bookings it offers, with the whole-GPU
slice each fits, and a session "in reservation X" charged to its project only inside its
window."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.hub.form import ChoiceRefused, booking_choices, form_context, in_booking

OFFER = {"now": 1000.0, "projects": ["thesis", "course"], "choices": [
    {"key": "cpu", "kind": "cpu"}, {"key": "gpu:1", "kind": "gpu"},
    {"key": "gpu:2", "kind": "gpu"}], "bookings": [
    {"id": "bk-open", "project": "course", "gpus": 2, "start": 900.0, "end": 2000.0,
     "state": "active"},
    {"id": "bk-later", "project": "course", "gpus": 3, "start": 5000.0, "end": 9000.0,
     "state": "booked"},
    {"id": "bk-gone", "project": "course", "gpus": 1, "start": 0.0, "end": 10.0,
     "state": "cancelled"}]}


def test_the_form_offers_its_projects_bookings_with_the_slice_each_fits():
    got = {b["id"]: (b["open"], b["slice"]) for b in booking_choices(OFFER, ["gpu:1", "gpu:2"])}
    assert got == {"bk-open": (True, "gpu:2"), "bk-later": (False, "gpu:2")}
    ctx = form_context(OFFER, {}, ["1h"], "1h")
    assert [b["id"] for b in ctx["bookings"]] == ["bk-open", "bk-later"]


def test_a_session_in_a_reservation_is_charged_to_its_project_only_inside_its_window():
    opts = {"project": "thesis", "slice": "gpu:2", "min_runtime": "1h"}
    assert in_booking(opts, "bk-open", OFFER, 1000.0, "alice")["project"] == "course"
    with pytest.raises(ChoiceRefused, match="not open now"):
        in_booking(opts, "bk-later", OFFER, 1000.0, "alice")
    with pytest.raises(ChoiceRefused, match="not open now"):
        in_booking(opts, "bk-open", OFFER, 2000.0, "alice")
    with pytest.raises(ChoiceRefused, match="not a reservation of your projects"):
        in_booking(opts, "bk-someone-elses", OFFER, 1000.0, "alice")
