"""The spawn form's template and context (without a hub: the browser tests drive the real
page), the form's choices kept after an error, an admin's own template, and the queue page's
progress events (one per real change, a position-based bar, the "free now" hint)."""

from __future__ import annotations

import asyncio
import html
import re

import pytest

from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.core.offer import slice_choices
from jupyter_gpubudget.hub import queue
from jupyter_gpubudget.hub.form import form_context, quote_words, render_template, slice_hint
from jupyter_gpubudget.hub.spawner import BudgetSpawner

INVENTORY = load_inventory("""
nodes:
  - {name: a, model: H100-80GB, gpus: 4, mig: [3]}
""")
OFFER = {
    "projects": ["lattice-qcd", "astro"], "inventory": "declared", "inventory_gpus": 4,
    "min_runtime_cap": 4 * 3600, "window_s": 7 * 86400, "now": 1000.0,
    "choices": slice_choices(INVENTORY),
    "figures": {"lattice-qcd": {"grant_hours": 800.0, "usage_hours": 388.4, "left_hours": 411.6,
                                "standing": 0.4855, "parent": "physics"},
                "astro": {"grant_hours": 400.0, "usage_hours": 520.0, "left_hours": -120.0,
                          "standing": 1.3, "parent": "physics"}},
}
PRESETS = ["30m", "1h", "2h", "4h", "8h"]


def render(offer: dict = OFFER, chosen: dict | None = None, template: str = "") -> str:
    ctx = form_context(offer, chosen or {}, PRESETS, "1h")
    ctx.update(quote_url="/hub/api/gpubudget/users/alice/quote", server_name="",
               user_name="alice", quote_json="null", quote_text="")
    return render_template(template, ctx)


def text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def test_projects_show_grant_used_left_and_standing_in_words():
    page = render()
    options = re.findall(r"<option value=\"([^\"]+)\"[^>]*>([^<]+)</option>", page)
    assert [v for v, _ in options] == ["lattice-qcd", "astro"]
    assert html.unescape(options[0][1]) == \
        "lattice-qcd — 412 of 800 GPU-h left · under its share: starts first"
    assert html.unescape(options[1][1]) == \
        "astro — 0 of 400 GPU-h left · over its share: starts after others"
    t = text(page)
    assert "physics › lattice-qcd: granted 800 GPU-h per 7 days, used 388 GPU-h, 412 GPU-h " \
           "left. Standing 0.49 (used ÷ grant)" in t


def test_slices_are_grouped_with_memory_and_compute():
    t = text(render())
    order = [t.index(g) for g in ("CPU only —", "MIG slices —", "MPS shares —", "Whole GPUs —")]
    assert order == sorted(order)
    assert "MIG 3g.40gb 40 GB memory · 3/7 of an H100-80GB · 0.43 GPU-h per hour" in t
    assert "2 whole GPUs 160 GB memory · 2.00 GPU-h per hour" in t
    assert "MPS share, 25% 25% of a GPU's compute · its 80 GB memory shared" in t
    assert slice_hint({"kind": "cpu"}) == "no GPU · costs no GPU-hours"
    # the smallest GPU slice is the default choice
    assert re.search(r'value="mig:1g\.10gb"[^>]*checked', render())


def test_the_cluster_choice_appears_only_where_there_are_several():
    assert 'name="cluster"' not in render()  # one cluster: no choice to make
    one = {**OFFER, "clusters": [{"name": "default", "gpus": 4, "nodes": 1,
                                  "models": ["H100-80GB"]}]}
    assert 'name="cluster"' not in render(one)
    two = {**OFFER, "clusters": [
        {"name": "ws", "gpus": 1, "nodes": 1, "models": ["H100-80GB"]},
        {"name": "hpc", "gpus": 16, "nodes": 2, "models": ["A100-80GB", "H100-80GB"]}]}
    page = render(two)
    assert re.findall(r'name="cluster" value="([^"]*)"', page) == ["", "ws", "hpc"]
    assert re.search(r'name="cluster" value=""[^>]*checked', page)  # soonest, by default
    t = text(page)
    assert "Wherever it starts soonest" in t and "ws 1 GPU (H100-80GB) on 1 node" in t
    assert "hpc 16 GPUs (A100-80GB, H100-80GB) on 2 nodes" in t
    assert 'id="gpubudget-q-cluster"' in page
    # after an error the form comes back with the cluster chosen; an unknown one is dropped
    assert re.search(r'name="cluster" value="hpc"[^>]*checked',
                     render(two, {"cluster": "hpc"}))
    assert re.search(r'name="cluster" value=""[^>]*checked', render(two, {"cluster": "x"}))


def test_quote_words_name_the_cluster():
    answer = {"project": "p", "now": 1000.0,
              "quote": {"starts_now": True, "backed": True, "protected_s": 3600,
                        "cost_gpu_hours": 1.0, "cluster": "hpc"}}
    assert quote_words(answer).startswith("p: starts now on cluster hpc; protected for 1 h")


def test_minimum_runtime_presets_stop_at_the_cap_and_a_custom_value_is_kept():
    page = render()
    values = re.findall(r'name="min_runtime" value="([^"]+)"', page)
    assert values == ["30m", "1h", "2h", "4h", "custom"]  # 8h is above the 4 h cap
    assert re.search(r'value="1h" checked', page)
    assert "at most 4 h" in text(page)
    page = render(chosen={"project": "astro", "slice": "gpu:2", "min_runtime": "90m"})
    assert re.search(r'value="custom" id="gpubudget-runtime-custom" checked', page)
    assert 'value="90m"' in page
    assert re.search(r'<option value="astro"\s+selected', page)
    assert re.search(r'value="gpu:2"[^>]*checked', page)


def test_the_form_keeps_the_choices_after_an_error():
    sp = BudgetSpawner.__new__(BudgetSpawner)
    BudgetSpawner.__init__(sp)
    sp._offer = {"projects": ["lattice-qcd", "astro"]}
    with pytest.raises(Exception) as e:
        sp.options_from_form({"project": ["astro"], "slice": ["mps:250"],
                              "min_runtime": ["custom"], "min_runtime_custom": ["soon"]})
    assert "Minimum runtime" in str(e.value) and "'soon'" in str(e.value)
    assert sp.form_choices() == {"project": "astro", "slice": "mps:250", "min_runtime": "soon"}
    page = render(chosen=sp.form_choices())
    assert re.search(r'<option value="astro"\s+selected', page)
    assert re.search(r'value="mps:250"[^>]*checked', page) and 'value="soon"' in page
    opts = sp.options_from_form({"project": ["lattice-qcd"], "slice": ["gpu:1"],
                                 "min_runtime": ["custom"], "min_runtime_custom": ["3h"]})
    assert opts == {"project": "lattice-qcd", "slice": "gpu:1", "min_runtime": "3h"}


def test_a_user_in_no_project_gets_a_clear_page_and_no_start_button():
    page = render({**OFFER, "projects": [], "figures": {}})
    assert "You are not in any GPU project yet" in page
    assert "#spawn_form .feedback-container { display: none; }" in page
    assert 'name="project"' not in page and 'name="slice"' not in page


def test_an_admins_template_extends_the_default(tmp_path):
    mine = tmp_path / "form.html"
    mine.write_text('{% extends "gpubudget_form.html" %}\n'
                    '{% block intro %}<p class="site">Ask #gpu-help on chat.</p>{% endblock %}')
    page = render(template=str(mine))
    assert '<p class="site">Ask #gpu-help on chat.</p>' in page
    assert "Protected</b>: for the minimum runtime" not in page  # the block was replaced
    assert 'name="slice"' in page  # the rest is the default


# ---------------------------------------------------------------- queue progress events
class FakeSpawner:
    """What queue.progress reads: the phase, the session as the service last said, and the
    change event the long-poll sets."""

    def __init__(self) -> None:
        self._phase = "queued"
        self._session: dict = {}
        self._changed = asyncio.Event()
        self.placement = [{"node": "a", "gpu": 3, "kind": "mig", "profile": "3g.40gb"}]
        self.child = None
        self._progress_watchers = 0
        self._resuming: dict | None = None  # not a resumed (snapshotted) session
        self._restore: dict | None = None
        self._restore_told = asyncio.Event()

    def say(self, **session) -> None:
        self._session = {"id": "s1", "project": "astro", "request": {"kind": "gpu", "gpus": 1},
                         **session}
        self._changed.set()


async def test_progress_events_change_only_when_something_changes(monkeypatch):
    monkeypatch.setattr(queue, "_changed", _fast_changed)
    sp = FakeSpawner()
    events: list[dict] = []

    async def read() -> None:
        async for ev in queue.progress(sp):
            events.append(ev)

    task = asyncio.ensure_future(read())
    await asyncio.sleep(0.05)
    sp.say(queue_position=None)  # not yet in the last cycle's queue
    await asyncio.sleep(0.05)
    for pos, pred in [(3, 5000.0), (3, 5000.0), (3, 5100.0), (3, 5200.0), (2, 5200.0),
                      (2, 5200.0), (1, 6000.0)]:
        sp.say(queue_position=pos, predicted_start=pred)
        await asyncio.sleep(0.05)
    sp.say(queue_position=1, predicted_start=6000.0,
           free_now=[{"key": "mig:3g.40gb", "label": "MIG 3g.40gb", "kind": "mig"}])
    await asyncio.sleep(0.05)
    sp.say(queue_position=1, predicted_start=6000.0,
           free_now=[{"key": "mig:3g.40gb", "label": "MIG 3g.40gb", "kind": "mig"}])
    await asyncio.sleep(0.05)
    sp._phase = "starting"
    sp._session = {**sp._session, "protected_until": None, "backed": True}
    sp._changed.set()
    await asyncio.wait_for(task, 2)

    msgs = [e["message"] for e in events]
    assert len(msgs) == len(set(msgs)), msgs  # nothing repeated
    assert not any("?" in m for m in msgs)  # never "position ?"
    queued = [e for e in events if e.get("gpubudget", {}).get("queue_position")]
    # 3 (5000), 3 moved by more than 5 min? no: 5200 - 5000 = 200 s; 2; 1 (6000); free now
    assert [e["gpubudget"]["queue_position"] for e in queued] == [3, 2, 1, 1]
    assert [e["progress"] for e in queued] == [5, 18, 32, 32]  # the share of the queue gone
    assert msgs[0] == "Joining the queue..."
    assert "position 2 in the queue (1 ahead of you)" in queued[1]["message"]
    assert queued[-1]["gpubudget"]["hint"] == \
        "A MIG 3g.40gb slice is free now: leave the queue and choose it on the form to start " \
        "at once."
    assert queued[-1]["message"].endswith(queued[-1]["gpubudget"]["hint"])
    granted = [e for e in events if e["message"].startswith("Granted")]
    assert len(granted) == 1 and granted[0]["progress"] == 50
    progress = [e["progress"] for e in events]
    assert progress == sorted(progress)  # the bar never goes back


async def _fast_changed(sp, timeout: float = 5) -> None:  # noqa: ANN001
    sp._changed.clear()
    try:
        await asyncio.wait_for(sp._changed.wait(), 0.5)
    except TimeoutError:
        pass


def test_free_words():
    assert queue.free_words([]) == ""
    two = [{"key": "gpu:2"}, {"key": "mps:500"}, {"key": "mig:1g.10gb"}]
    assert queue.free_words(two).startswith("2 whole GPUs are free now (or a smaller one): ")
    assert queue.free_words([{"key": "mps:500"}]).startswith("An MPS share of 50% is free now:")
