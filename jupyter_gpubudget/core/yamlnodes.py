"""Strict YAML reading that remembers where each value came from.

PyYAML's composer gives nodes with line marks; we walk them ourselves so every error can name
the dotted path and the line, and so duplicate keys (which PyYAML silently merges) are refused.
Parsing only — no file access: callers pass text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

#: limits on what a YAML input may be: refused with a clear error beyond them, so a hostile
#: file (huge, deeply nested, an alias bomb) costs milliseconds, not minutes and gigabytes
MAX_BYTES = 1024 * 1024  # the file's size (about 25,000 accounts in a budgets file)
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_EVENTS = 1_000_000  # parser events (about three per value)
MAX_VALUES = 200_000  # values after alias expansion
MAX_ALIASES = 1_000  # uses of anchors (*name)
MAX_DURATION = 100 * 366 * 86400.0  # any duration: a century


class ConfigError(ValueError):
    """Bad input: names the source, the dotted path and the 1-based line."""

    def __init__(self, message: str, path: str = "", line: int | None = None,
                 source: str = "<input>") -> None:
        self.message = message
        self.path = path
        self.line = line
        self.source = source
        where = source
        if line is not None:
            where += f":{line}"
        if path:
            where += f": {path}"
        super().__init__(f"{where}: {message}")


@dataclass(slots=True)
class Node:
    """A YAML value with its location. ``value`` holds plain Python for scalars, or
    ``dict[str, Node]`` / ``list[Node]`` for collections."""

    value: Any
    line: int
    path: str
    source: str

    def error(self, message: str) -> ConfigError:
        return ConfigError(message, self.path, self.line, self.source)

    # ---- typed accessors -------------------------------------------------
    def mapping(self, allowed: set[str] | None = None) -> dict[str, Node]:
        if not isinstance(self.value, dict):
            raise self.error(f"expected a mapping, got {describe(self.value)}")
        if allowed is not None:
            for key, child in self.value.items():
                if key not in allowed:
                    raise ConfigError(
                        f"unknown key {key!r} (allowed: {', '.join(sorted(allowed))})",
                        child.path, child.line, self.source)
        return self.value

    def seq(self) -> list[Node]:
        if not isinstance(self.value, list):
            raise self.error(f"expected a list, got {describe(self.value)}")
        return self.value

    def string(self) -> str:
        if not isinstance(self.value, str) or not self.value.strip():
            raise self.error(f"expected a non-empty string, got {describe(self.value)}")
        return self.value

    def number(self, *, minimum: float | None = 0.0, integer: bool = False,
               maximum: float | None = None) -> float:
        v = self.value
        if isinstance(v, str) and _FLOATISH.match(v.strip()):
            big = not math.isfinite(float(v))
            raise self.error(f"expected a number, got {describe(v)}" + (
                ": the number is too large" if big else
                " (YAML reads a number with an exponent but no '.' as text: write e.g. "
                "1.0e+3)"))
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.error(f"expected a number, got {describe(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise self.error(f"expected a finite number, got {v}")
        try:
            f = float(v)
        except OverflowError:
            raise self.error("the number is too large") from None
        if integer and not f.is_integer():
            raise self.error(f"expected a whole number, got {v}")
        if minimum is not None and f < minimum:
            raise self.error(f"must be ≥ {minimum:g}, got {f:g}")
        if maximum is not None and f > maximum:
            raise self.error(f"must be ≤ {maximum:g}, got {f:g}")
        return f

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.error(f"expected true or false, got {describe(self.value)}")
        return self.value

    def string_list(self) -> list[str]:
        if isinstance(self.value, str):
            return [self.string()]
        return [n.string() for n in self.seq()]

    def duration(self) -> float:
        """Seconds from ``90``, ``"30m"``, ``"8h"``, ``"7d"``, ``"2w"`` or ``"1h30m"``."""
        v = self.value
        if isinstance(v, int | float) and not isinstance(v, bool):
            return self.number(maximum=MAX_DURATION)
        if isinstance(v, str):
            secs = parse_duration(v)
            if secs is not None:
                if not secs <= MAX_DURATION:
                    raise self.error(f"a duration is at most {MAX_DURATION / 86400 / 366:g} "
                                     f"years, got {v[:40]!r}")
                return secs
        raise self.error(f"expected a duration such as 90, '30m', '8h' or '7d', got {describe(v)}")


_FLOATISH = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float | None:
    s = text.strip().lower().replace(" ", "")
    if not s:
        return None
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return total if pos == len(s) and pos > 0 else None


def describe(v: Any) -> str:
    if v is None:
        return "nothing (null)"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, bool):
        return f"boolean {str(v).lower()}"
    return f"{type(v).__name__} {v!r}"


_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built


def decode(data: bytes | str, source: str = "<input>", limit: int = MAX_BYTES) -> str:
    """The text of an input: at most ``limit`` bytes of UTF-8 (errors name the line)."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ConfigError(f"the file is {size / 1e6:.1f} MB; at most {limit / 1e6:.1f} MB is "
                          "read", "", None, source)
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})",
                          "", line, source) from None


def _prescan(text: str, source: str) -> None:
    """Walk the parser's events (iteratively: no recursion, whatever the nesting) and refuse
    inputs that are too deep, too long or use too many aliases before anything is built."""
    depth = events = aliases = 0
    try:
        for ev in yaml.parse(text, Loader=_SAFE_LOADER):
            events += 1
            line = ev.start_mark.line + 1 if ev.start_mark is not None else None
            if isinstance(ev, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ConfigError(f"nested deeper than {MAX_DEPTH} levels", "", line,
                                      source)
            elif isinstance(ev, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                depth -= 1
            elif isinstance(ev, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise ConfigError(f"more than {MAX_ALIASES} aliases (*name)", "", line,
                                      source)
            if events > MAX_EVENTS:
                raise ConfigError(f"more than {MAX_EVENTS} YAML events", "", line, source)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"not valid YAML: {e.problem or e}", "", line, source) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {e}", "", None, source) from None


def parse(text: str | bytes, source: str = "<input>") -> Node:
    """Parse one YAML document into located :class:`Node` values (safe tags only), within the
    limits above."""
    text = decode(text, source)
    _prescan(text, source)
    try:
        root = yaml.compose(text, Loader=_SAFE_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"not valid YAML: {e.problem or e}", "", line, source) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {e}", "", None, source) from None
    if root is None:
        raise ConfigError("the document is empty", "", 1, source)
    return _convert(root, "", source, set(), [0])


def _convert(node: yaml.Node, path: str, source: str, active: set[int],
             count: list[int]) -> Node:
    line = node.start_mark.line + 1
    count[0] += 1
    if count[0] > MAX_VALUES:  # aliases can multiply a small document
        raise ConfigError(f"more than {MAX_VALUES} values once aliases are expanded",
                          path, line, source)
    if id(node) in active:  # an alias that refers to its own ancestor
        raise ConfigError("recursive YAML alias (a value contains itself)", path, line, source)
    if isinstance(node, yaml.MappingNode):
        active.add(id(node))
        out: dict[str, Node] = {}
        for knode, vnode in node.value:
            if knode.tag == "tag:yaml.org,2002:merge":
                raise ConfigError("YAML merge keys (<<) are not supported", path, line, source)
            key = _scalar(knode, path, source)
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise ConfigError(f"keys must be names, got {describe(key)}", path,
                                  knode.start_mark.line + 1, source)
            key = str(key)
            child_path = f"{path}.{key}" if path else key
            if key in out:
                raise ConfigError(f"duplicate key {key!r} (first at line {out[key].line})",
                                  child_path, knode.start_mark.line + 1, source)
            out[key] = _convert(vnode, child_path, source, active, count)
            out[key].line = knode.start_mark.line + 1
        active.discard(id(node))
        return Node(out, line, path, source)
    if isinstance(node, yaml.SequenceNode):
        active.add(id(node))
        items = [_convert(v, f"{path}[{i}]", source, active, count)
                 for i, v in enumerate(node.value)]
        active.discard(id(node))
        return Node(items, line, path, source)
    return Node(_scalar(node, path, source), line, path, source)


def _scalar(node: yaml.Node, path: str, source: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise ConfigError("expected a plain value here", path, node.start_mark.line + 1, source)
    if len(node.value) > 10_000:
        raise ConfigError("a value longer than 10000 characters", path,
                          node.start_mark.line + 1, source)
    try:
        return _CONSTRUCTOR.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, OverflowError) as e:
        raise ConfigError(f"bad value: {e}", path, node.start_mark.line + 1, source) from None


_CONSTRUCTOR = yaml.SafeLoader("")  # only its scalar constructors are used
