"""Core suite settings for mutation runs (``make mutation``, bench/mutation.py).

mutmut sets ``MUTANT_UNDER_TEST`` in every process it runs the tests in. There, and only
there:

- hypothesis uses the ``mutation`` profile (helpers.prop_settings): fewer examples,
  derandomized (each mutant meets the same examples, so a verdict does not depend on luck),
  no example database;
- tests run cheapest first: mutmut stops at a mutant's first failing test (``-x``), so the
  hand-computed unit tests get the first chance to kill it and the property and long-run
  tests run only for mutants those let through.

An ordinary ``pytest tests/core`` is not affected by anything here.
"""

from __future__ import annotations

import pytest

from .helpers import MUTATION

#: test modules that take long, in the order they run after everything else
SLOW_LAST = ("test_props_capacity.py", "test_props_scheduler.py",
             "test_properties.py", "test_convergence.py")


def _cost(item: pytest.Item) -> int:
    name = item.path.name
    return SLOW_LAST.index(name) + 1 if name in SLOW_LAST else 0


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    if MUTATION:
        items.sort(key=_cost)  # stable: the given order within each group
