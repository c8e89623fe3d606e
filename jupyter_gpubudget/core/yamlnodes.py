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

    def number(self, *, minimum: float | None = 0.0, integer: bool = False) -> float:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.error(f"expected a number, got {describe(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise self.error(f"expected a finite number, got {v}")
        if integer and not float(v).is_integer():
            raise self.error(f"expected a whole number, got {v}")
        if minimum is not None and v < minimum:
            raise self.error(f"must be ≥ {minimum:g}, got {v}")
        return float(v)

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
            return self.number()
        if isinstance(v, str):
            secs = parse_duration(v)
            if secs is not None:
                return secs
        raise self.error(f"expected a duration such as 90, '30m', '8h' or '7d', got {describe(v)}")


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


def parse(text: str, source: str = "<input>") -> Node:
    """Parse one YAML document into located :class:`Node` values (safe tags only)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"not valid YAML: {e.problem or e}", "", line, source) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {e}", "", None, source) from None
    if root is None:
        raise ConfigError("the document is empty", "", 1, source)
    return _convert(root, "", source, set())


def _convert(node: yaml.Node, path: str, source: str, active: set[int]) -> Node:
    line = node.start_mark.line + 1
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
            out[key] = _convert(vnode, child_path, source, active)
            out[key].line = knode.start_mark.line + 1
        active.discard(id(node))
        return Node(out, line, path, source)
    if isinstance(node, yaml.SequenceNode):
        active.add(id(node))
        items = [_convert(v, f"{path}[{i}]", source, active) for i, v in enumerate(node.value)]
        active.discard(id(node))
        return Node(items, line, path, source)
    return Node(_scalar(node, path, source), line, path, source)


def _scalar(node: yaml.Node, path: str, source: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise ConfigError("expected a plain value here", path, node.start_mark.line + 1, source)
    try:
        return _CONSTRUCTOR.construct_object(node, deep=True)
    except yaml.YAMLError as e:
        raise ConfigError(f"bad value: {e}", path, node.start_mark.line + 1, source) from None


_CONSTRUCTOR = yaml.SafeLoader("")  # only its scalar constructors are used
