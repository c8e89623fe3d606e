"""The refusal of a cycle of "runs after" is general: a depth-first search over the jobs
of one submission and the existing jobs they reach (``find_cycle``), and ``resolve_after``
refuses a cycle, as an unknown id, with a 400 naming the field ``after`` and writes
nothing."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.store import LedgerError
from jupyter_gpubudget.service.dependencies import find_cycle, resolve_after

EXISTING = {"prep": [], "train": ["prep"], "eval": ["train"], "report": ["eval", "prep"]}


def test_no_cycle_through_a_long_existing_graph():
    assert find_cycle({"new": ["report", "train"]}, EXISTING.__getitem__) is None
    assert find_cycle({}, EXISTING.__getitem__) is None


def test_a_cycle_inside_one_submission_of_several_jobs():
    submitted = {"a": ["b"], "b": ["c", "prep"], "c": ["a"], "d": ["a"]}
    assert find_cycle(submitted, EXISTING.__getitem__) == ["a", "b", "c", "a"]
    assert find_cycle({"x": ["x"]}, EXISTING.__getitem__) == ["x", "x"]  # names itself


def test_a_cycle_through_the_existing_graph():
    """A submitted job that existing jobs run after (as a resubmitted one they named would
    be): the search follows the existing edges back to it."""
    graph = {**EXISTING, "prep": ["new"]}
    assert find_cycle({"new": ["report"]}, graph.__getitem__) == [
        "new", "report", "eval", "train", "prep", "new"]


def test_each_job_is_visited_once():
    """A wide diamond: 2,000 jobs each after the same 2,000; without the visited set the
    search would walk 4,000,000 edges."""
    layer = [f"l{i}" for i in range(2000)]
    reads: list[str] = []

    def after_of(w: str) -> list[str]:
        reads.append(w)
        return layer if w.startswith("m") else []

    assert find_cycle({"new": [f"m{i}" for i in range(2000)]}, after_of) is None
    assert len(reads) == len(set(reads)) == 4000


@pytest.fixture
def ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    upgrade(url)
    engine = connect(url)
    led = Ledger(engine)
    led.sync_budgets(load_budgets("accounts:\n  lab: {grant: 10, members: [ann]}\n"),
                     time.time())
    yield led
    engine.dispose()


def test_resolve_after_refuses_unknown_ids_and_cycles_naming_the_field(ledger):
    def submit(name: str, after: list[str] | None = None) -> str:
        with ledger.tx() as s:
            ids = resolve_after(ledger, "ann", after, name, s) if after else None
            return ledger.submit(project="lab", user="ann", kind="batch", now=time.time(),
                                 request={"kind": "gpu", "gpus": 0}, command=["true"],
                                 name=name, after=(ids, "afterok") if ids else None, s=s).id

    prep = submit("prep")
    train = submit("train", ["prep"])
    with ledger.ro() as s:
        assert resolve_after(ledger, "ann", ["train", prep], "eval", s) == [train, prep]
    for refs, words in ((["nosuch"], "no job or array 'nosuch'"),
                        (["prep", "eval"], "cycle eval -> eval"),
                        ([train, "eval"], "cycle eval -> eval")):
        with pytest.raises(LedgerError) as e:
            submit("eval", refs)
        assert e.value.status == 400 and e.value.field == "after", e.value
        assert words in str(e.value), e.value
    assert {w.name for w in ledger.workloads()} == {"prep", "train"}  # nothing written
