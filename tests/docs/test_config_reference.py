"""docs/config-reference.md is generated from the traits' ``help=`` strings
(``python -m jupyter_gpubudget.configref``): it must be what the code generates now, so a
changed help string, default or new option without regenerating fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jupyter_gpubudget import configref

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "config-reference.md"


def test_committed_reference_is_what_the_code_generates():
    diff = configref.check(REFERENCE, configref.render())
    assert not diff, ("docs/config-reference.md is stale; run "
                      "`python -m jupyter_gpubudget.configref`:\n" + "\n".join(diff[:60]))


def test_every_part_with_options_is_listed():
    names = {c.__name__ for c in configref.configurables()}
    # the service app, the spawner, each backend, the server extension, the privileged call,
    # the snapshot store: each configured by a different person in a different file
    for expected in ("GpuBudgetService", "BudgetSpawner", "LocalBackend", "SlurmBackend",
                     "KubernetesBackend", "KubePlacement", "GpuBudgetLab", "GpuBudgetSnapshots",
                     "Privileged", "Store", "CriuSnapshotter", "NvmlHealthSource"):
        assert expected in names
    text = REFERENCE.read_text(encoding="utf-8")
    for cls in configref.configurables():
        for name, trait in cls.class_own_traits(config=True).items():
            assert f"#### `{cls.__name__}.{name}`" in text
            assert trait.help.strip(), f"{cls.__name__}.{name} has no help= string"


def test_a_changed_help_string_is_caught(monkeypatch):
    from jupyter_gpubudget.service.app import GpuBudgetService

    trait = GpuBudgetService.class_traits()["cycle_interval"]
    monkeypatch.setattr(trait, "help", "Seconds between cycles, said differently.")
    diff = configref.check(REFERENCE, configref.render())
    assert any(line.startswith("+Seconds between cycles, said differently.") for line in diff)
    assert any(line.startswith("-") and "scheduling cycles" in line for line in diff)


def test_the_command_checks_and_writes(tmp_path):
    """The command a maintainer runs: --check fails on a stale file naming the difference and
    changes nothing; without --check it writes the file, which then checks clean."""
    stale = tmp_path / "config-reference.md"
    text = REFERENCE.read_text(encoding="utf-8")
    edited = text.replace("scheduling cycles", "cycles of scheduling", 1)
    assert edited != text
    stale.write_text(edited, encoding="utf-8")
    cmd = [sys.executable, "-m", "jupyter_gpubudget.configref", "-o", str(stale)]
    r = subprocess.run([*cmd, "--check"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 1
    assert "is stale" in r.stderr and "-Seconds between cycles of scheduling" in r.stderr
    assert stale.read_text(encoding="utf-8") == edited
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert stale.read_text(encoding="utf-8") == text
    r = subprocess.run([*cmd, "--check"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_defaults_do_not_name_this_machine():
    """A default such as the launcher's Python is sys.executable: written as such, so the
    reference generated on another machine is the same file."""
    text = configref.render()
    assert sys.executable not in text
    assert "`LocalBackend.launcher_python`" in text and "`sys.executable`" in text


def test_help_text_shows_as_written():
    """A help string's ``<profile>`` would be taken for an HTML tag and vanish from the page;
    a line starting with ``#`` would become a heading."""
    assert configref._help("nvidia.com/mig-<profile>, `<kept in code>`") == \
        "nvidia.com/mig-&lt;profile>, `<kept in code>`"
    assert configref._help("one\n# two") == "one\n\\# two"
