"""No tracker numbers in the repository: an issue's or a pull request's number means nothing
to someone reading the code, the tests or the docs. Say what is meant in words ("the policy goals", "the 3-day
synthetic run"). A reference to another project's tracker names that project
(``owner/name issue N``, as a patch of CRIU's does) and is allowed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: "issue" with a number after it, any case, "issues" too
#: (across a line break too, and a comment's ``#`` at the start of the next line)
ISSUE = re.compile(r"\bissues?\s+(?:#\s*)?#?\d+", re.IGNORECASE)
#: tracker-style, a hash and a number: after a word that points at a tracker, or alone in parentheses
HASH = re.compile(r"(\b(issues?|pr|pull( request)?|fix(es|ed)?|close[sd]?|see|refs?|"
                  r"ticket|bug)\s*#\d+)|\(#\d+\)|\bgh-\d+\b", re.IGNORECASE)
#: another project's tracker, named: owner/name issue N (an upstream patch's origin)
UPSTREAM = re.compile(r"[\w.-]+/[\w.-]+\s+issues?\s+#?\d+", re.IGNORECASE)
TEXT = (".py", ".md", ".ts", ".tsx", ".yaml", ".yml", ".toml", ".html", ".j2", ".cfg",
        ".txt", ".sh", ".patch", ".json", "Makefile", ".css", ".ini")
SKIP = ("package-lock.json", "yarn.lock")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    names = [n for n in out.stdout.decode().split("\0") if n]
    return [ROOT / n for n in names
            if n.endswith(TEXT) and not n.endswith(SKIP) and (ROOT / n).is_file()]


def tracker_references(text: str) -> list[tuple[int, str]]:
    """(line, text) of every reference, one that a line break splits included."""
    rest = UPSTREAM.sub(lambda m: re.sub(r"\S", "x", m.group()), text)  # same offsets
    lines = text.splitlines()
    found = []
    for m in (*ISSUE.finditer(rest), *HASH.finditer(rest)):
        no = text.count("\n", 0, m.start()) + 1
        found.append((no, lines[no - 1].strip()))
    return sorted(set(found))


def test_the_patterns_catch_what_they_should():
    issue, n = "issue", " 14"  # split, so that this file has no reference of its own
    assert tracker_references(f"the goals of {issue}{n}, and {issue}{n}'s worst")
    assert tracker_references(f'"""{issue.title()}{n}, item 9: a spawn ..."""')
    assert tracker_references(f"the goals of {issue}\n{n.strip()} over seeds") == [
        (1, f"the goals of {issue}")]
    assert tracker_references(f"    # see {issue}\n    #{n} for the goals")
    assert tracker_references(f"fixes #{n.strip()}")
    assert tracker_references(f"as measured (#{n.strip()})")
    assert not tracker_references(f"upstream: checkpoint-restore/criu {issue} 2705")
    assert not tracker_references("queued #3 · starts ~14:05")  # the sidebar's queue place
    assert not tracker_references("the 3-day synthetic run, seeds 0-20")


def test_no_tracker_numbers_in_the_repository():
    files = tracked_files()
    assert any(f.name == "README.md" for f in files)
    places = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        places += [f"{f.relative_to(ROOT)}:{no}: {line[:120]}"
                   for no, line in tracker_references(text)]
    assert not places, ("tracker numbers mean nothing to a reader; say what is meant in "
                        "words:\n" + "\n".join(places))
