"""Every relative link in README.md and docs/*.md (and the results under bench/results/)
points to a file that exists, and an anchor to a heading that file has."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "bench" / "results").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out, fenced = [], False
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        if not fenced:
            out += [(no, m.group(1)) for m in LINK.finditer(re.sub(r"`[^`]*`", "", line))]
    return out


def broken(path: Path) -> list[str]:
    bad = []
    for no, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file)).resolve() if file else path
        where = f"{path.relative_to(ROOT)}:{no}: {target}"
        if not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            bad.append(f"{where} (no heading #{anchor})")
    return bad


def test_slugs_as_github_makes_them():
    assert slug(" Policy (budgets YAML `policy:`)") == "policy-budgets-yaml-policy"
    assert slug(" Devices: one placement → device builder") == "devices-one-placement--device-builder"
    assert slug(" MPS shares first (`mps_mig_first`, on)") == "mps-shares-first-mps_mig_first-on"


def test_every_relative_link_resolves():
    docs = documents()
    assert len(docs) > 3
    bad = [b for d in docs for b in broken(d)]
    assert not bad, "broken links:\n" + "\n".join(bad)
