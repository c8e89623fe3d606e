"""The configuration reference, generated from the code: every configurable trait of every
``traitlets`` Configurable class that ``jupyter_gpubudget`` defines (class, name, type, default,
``help=``), and the keys of the budgets YAML's ``policy:`` section with their defaults.

    python -m jupyter_gpubudget.configref            # writes docs/config-reference.md
    python -m jupyter_gpubudget.configref --check    # exit 1, naming what differs, if it is stale

The ``help=`` strings are the single source: change one, then run the first command.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import inspect
import os
import pkgutil
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from traitlets import TraitType
from traitlets.config import Configurable

PACKAGE = "jupyter_gpubudget"
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "config-reference.md"

#: where each class is configured from, in the order the reference lists them
_WHERE = {
    "service": "the hub service (`gpubudget service`), in its config file "
               "(`GpuBudgetService.config_file`, usually `gpubudget_config.py`)",
    "backends": "the hub service's config file (the backend it runs jobs and sessions through)",
    "hub": "`jupyterhub_config.py` (the JupyterHub process)",
    "serverext": "the user's Jupyter server config (`jupyter_server_config.py`), or by the "
                 "spawner through the environment it sets",
    "snapshot": "the user's Jupyter server config (the snapshot extension builds these)",
}
_SECTION_ORDER = ["service", "backends", "hub", "serverext", "snapshot"]


class ImportFailed(RuntimeError):
    """A module of the package could not be imported, so its classes cannot be listed."""


def import_all(package: str = PACKAGE) -> list[str]:
    """Import every module of ``package`` (not ``__main__`` modules, which run a program) and
    return their names. A module that fails to import is an error naming it: the reference
    would silently miss its classes otherwise."""
    pkg = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except Exception as e:  # noqa: BLE001 - re-raised with the module's name
            raise ImportFailed(f"{info.name}: cannot import it ({type(e).__name__}: {e}); "
                               f"install the package with all its extras") from e
        names.append(info.name)
    return names


def configurables(package: str = PACKAGE) -> list[type[Configurable]]:
    """Every Configurable subclass defined in ``package`` that has configurable traits of its
    own, by module then name."""
    import_all(package)
    seen: set[type] = set()
    stack: list[type] = [Configurable]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
    found = [c for c in seen
             if (c.__module__ == package or c.__module__.startswith(package + "."))
             and c.class_own_traits(config=True)]
    return sorted(found, key=lambda c: (_section(c), c.__module__, c.__name__))


def _section(cls: type) -> int:
    part = cls.__module__.split(".")[1] if "." in cls.__module__ else ""
    return _SECTION_ORDER.index(part) if part in _SECTION_ORDER else len(_SECTION_ORDER)


def _stable(text: str) -> str:
    """A default that names this machine's paths, written the same on every machine."""
    for value, name in ((sys.executable, "sys.executable"), (sys.prefix, "sys.prefix"),
                        (os.path.expanduser("~"), "~")):
        if value and value not in ("/", "~"):
            text = text.replace(repr(value), name).replace(value, name)
    return text


def _computed(cls: type, name: str) -> bool:
    """Whether the trait's default is computed when the object is made (``@default``)."""
    return any(name in vars(c).get("_trait_default_generators", {}) for c in cls.__mro__)


def _type_name(trait: TraitType) -> str:
    kind = type(trait).__name__
    values = getattr(trait, "values", None)
    if kind in ("Enum", "CaselessStrEnum") and values:
        return f"{kind}: " + " | ".join(repr(v) for v in values)
    return kind


def _help(text: str) -> str:
    """The help text as Markdown that shows it as written: ``<profile>`` stays visible (not
    taken for an HTML tag), and a line that starts with ``#`` or ``>`` is no heading or
    quote."""
    text = inspect.cleandoc(text).strip() or "(no help written)"
    parts = re.split(r"(`[^`\n]*`)", text)  # code spans are shown as they are
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;")
    return re.sub(r"^([#>])", r"\\\1", "".join(parts), flags=re.M)


def _class_doc(cls: type) -> str:
    doc = inspect.cleandoc(vars(cls).get("__doc__") or "")  # its own, not a base's
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def render_traits(classes: Iterable[type[Configurable]]) -> list[str]:
    out: list[str] = []
    section = None
    for cls in classes:
        part = cls.__module__.split(".")[1]
        if part != section:
            section = part
            out += [f"## `{PACKAGE}.{part}`", ""]
            if part in _WHERE:
                out += [f"Set in {_WHERE[part]}.", ""]
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        out += [f"### {cls.__name__}", "",
                f"`{cls.__module__}.{cls.__name__}` (from {bases})", ""]
        doc = _class_doc(cls)
        if doc:
            out += [doc, ""]
        aliases = vars(cls).get("aliases") or {}
        if aliases:
            out += ["Command-line options: " + ", ".join(
                f"`--{flag}` (`{target if isinstance(target, str) else target[0]}`)"
                for flag, target in sorted(aliases.items())) + ".", ""]
        for name, trait in sorted(cls.class_own_traits(config=True).items()):
            default = f"`{_stable(trait.default_value_repr())}`"
            if _computed(cls, name):
                default += " (computed at start when not set)"
            out += [f"#### `{cls.__name__}.{name}`", "",
                    f"{_type_name(trait)}; default {default}", "",
                    _help(trait.help or ""), ""]
    return out


def render_policy() -> list[str]:
    """The ``policy:`` keys the budgets loader accepts, with the core's defaults."""
    from jupyter_gpubudget.core import accounts
    from jupyter_gpubudget.core.model import Policy

    keys = sorted(getattr(accounts, "_POLICY_KEYS", ()))
    if not keys:
        return []
    defaults = Policy()
    types = {f.name: f.type for f in dataclasses.fields(Policy)}
    out = ["## Budgets YAML: `policy:` keys", "",
           "Accepted under `policy:` in the budgets file (`gpubudget budgets check` validates "
           "them); what each one does is told in [the core's design](core.md#policy-budgets-yaml-policy). "
           "Durations are written `30m`, `8h`, `2d` or seconds; the defaults below are in "
           "seconds.", "",
           "| key | type | default |", "|---|---|---|"]
    for key in keys:
        value = getattr(defaults, key, None)
        kind = str(types.get(key, "?"))
        if isinstance(value, tuple) and all(isinstance(v, tuple) for v in value):
            value, kind = dict(value), "mapping of kind (interactive, batch, debug)"
        if key == "off_peak":  # none: every hour at full price
            kind = "mapping: timezone, factor, windows (admin.md, Off-peak prices)"
        out.append(f"| `{key}` | {kind} | `{value!r}` |")
    return out + [""]


def render(package: str = PACKAGE) -> str:
    lines = ["# Configuration reference", "",
             "<!-- generated by `python -m jupyter_gpubudget.configref` from the traits' "
             "help= strings: do not edit by hand -->", "",
             "Every option of every configurable class of jupyter-gpubudget, as "
             "`c.<Class>.<option> = value` in the config file named under each part. "
             "Options a class inherits (JupyterHub's `Spawner`, traitlets' `Application`) "
             "are documented by their own projects. Which guide says when to set them: "
             "[admin](admin.md), [deployment](deployment.md), [researcher](researcher.md).",
             ""]
    lines += render_traits(configurables(package))
    lines += render_policy()
    return "\n".join(lines).rstrip() + "\n"


def check(path: Path, text: str) -> list[str]:
    """The differences between ``path`` and ``text`` as a unified diff (empty: up to date)."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    return list(difflib.unified_diff(old.splitlines(), text.splitlines(),
                                     str(path), "generated", lineterm="", n=1))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jupyter_gpubudget.configref",
        description="Write the configuration reference generated from the traits' help= "
                    "strings and the budgets policy keys.")
    ap.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT,
                    help="file to write or check (default: %(default)s)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 with a diff when the file is not what the "
                         "code generates")
    args = ap.parse_args(argv)
    try:
        text = render()
    except ImportFailed as e:
        print(f"configref: {e}", file=sys.stderr)
        return 2
    if args.check:
        diff = check(args.output, text)
        if diff:
            print(f"{args.output} is stale: run `python -m jupyter_gpubudget.configref`",
                  file=sys.stderr)
            print("\n".join(diff), file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
