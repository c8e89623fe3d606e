"""Strict YAML reading (semantics 8: bad input gets a clear error naming the field and line,
and changes nothing): every accessor and limit of core/yamlnodes.py, each error word for word
with its source, dotted path and line."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core import yamlnodes as y
from jupyter_gpubudget.core.yamlnodes import (
    ConfigError,
    Node,
    decode,
    describe,
    parse,
    parse_duration,
)


def err(text: str | bytes, fn=lambda root: root) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(parse(text, "in.yaml"))
    return info.value


def test_config_error_names_source_line_and_path():
    e = ConfigError("bad", "a.b", 3, "f.yaml")
    assert str(e) == "f.yaml:3: a.b: bad"
    assert (e.message, e.path, e.line, e.source) == ("bad", "a.b", 3, "f.yaml")
    assert str(ConfigError("bad")) == "<input>: bad"
    assert str(ConfigError("bad", "", 7)) == "<input>:7: bad"
    assert str(ConfigError("bad", "p")) == "<input>: p: bad"
    assert isinstance(e, ValueError)


def test_nodes_remember_where_each_value_came_from():
    root = parse("a:\n  b: [1, x]\n  c: {d: true}\n", "s.yaml")
    m = root.mapping({"a"})
    a = m["a"].mapping()
    assert (root.line, root.path, root.source) == (1, "", "s.yaml")
    assert (m["a"].line, m["a"].path) == (1, "a")
    assert (a["b"].line, a["b"].path) == (2, "a.b")
    assert [(n.value, n.path, n.line) for n in a["b"].seq()] == [(1, "a.b[0]", 2),
                                                                   ("x", "a.b[1]", 2)]
    assert a["c"].mapping()["d"].boolean() is True
    assert a["c"].mapping()["d"].path == "a.c.d"


def test_accessor_errors_word_for_word():
    assert str(err("a: 1\n", lambda r: r.mapping({"b"}))) == (
        "in.yaml:1: a: unknown key 'a' (allowed: b)")
    assert str(err("[1]\n", lambda r: r.mapping())) == "in.yaml:1: expected a mapping, got a list"
    assert str(err("a: 1\n", lambda r: r.seq())) == "in.yaml:1: expected a list, got a mapping"
    assert str(err("a: ''\n", lambda r: r.mapping()["a"].string())) == (
        "in.yaml:1: a: expected a non-empty string, got str ''")
    assert str(err("a: '  '\n", lambda r: r.mapping()["a"].string())) == (
        "in.yaml:1: a: expected a non-empty string, got str '  '")
    assert str(err("a: 3\n", lambda r: r.mapping()["a"].string())) == (
        "in.yaml:1: a: expected a non-empty string, got int 3")
    assert str(err("a: yes\n", lambda r: r.mapping()["a"].string())) == (
        "in.yaml:1: a: expected a non-empty string, got boolean true")
    assert str(err("a: 1\n", lambda r: r.mapping()["a"].boolean())) == (
        "in.yaml:1: a: expected true or false, got int 1")
    assert str(err("a:\n", lambda r: r.mapping()["a"].boolean())) == (
        "in.yaml:1: a: expected true or false, got nothing (null)")
    assert str(err("a: [x, 1]\n", lambda r: r.mapping()["a"].string_list())) == (
        "in.yaml:1: a[1]: expected a non-empty string, got int 1")
    assert parse("a: x\n").mapping()["a"].string_list() == ["x"]
    assert parse("a: [x, y]\n").mapping()["a"].string_list() == ["x", "y"]
    assert str(err("a: {b: 1}\n", lambda r: r.mapping()["a"].string_list())) == (
        "in.yaml:1: a: expected a list, got a mapping")


def number(text: str, **kw) -> float:
    return parse(f"v: {text}\n").mapping()["v"].number(**kw)


def number_err(text: str, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        number(text, **kw)
    return info.value.message


def test_numbers_and_their_limits():
    assert number("3") == 3.0 and isinstance(number("3"), float)
    assert number("2.5") == 2.5
    assert number("0") == 0.0
    assert number("-2", minimum=None) == -2.0
    assert number("-2", minimum=-2) == -2.0
    assert number("7", maximum=7) == 7.0
    assert number("4", integer=True) == 4.0
    assert number_err("-1") == "must be ≥ 0, got -1"
    assert number_err("-2.5", minimum=-2) == "must be ≥ -2, got -2.5"
    assert number_err("8", maximum=7) == "must be ≤ 7, got 8"
    assert number_err("2.5", integer=True) == "expected a whole number, got 2.5"
    assert number_err("abc") == "expected a number, got str 'abc'"
    assert number_err("true") == "expected a number, got boolean true"
    assert number_err(".inf") == "expected a finite number, got inf"
    assert number_err("-.inf", minimum=None) == "expected a finite number, got -inf"
    assert number_err("1e3") == ("expected a number, got str '1e3' (YAML reads a number with "
                                 "an exponent but no '.' as text: write e.g. 1.0e+3)")
    assert number_err("'1e999'") == "expected a number, got str '1e999': the number is too large"
    assert number_err("'.5E-2'") .startswith("expected a number, got str '.5E-2' (YAML")
    assert number_err("'+2.E+3'").startswith("expected a number, got str '+2.E+3' (YAML")
    assert number_err("'1.0e3x'") == "expected a number, got str '1.0e3x'"
    assert number_err(str(10**400)) == "the number is too large"
    assert number("1.0e+3") == 1000.0


def test_durations():
    assert parse_duration("90") is None  # a bare number is seconds only as a YAML number
    assert parse_duration("30m") == 1800.0
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration(" 2 d ") == 2 * 86400.0
    assert parse_duration("1.5h") == 5400.0
    assert parse_duration("2W") == 2 * 604800.0
    assert parse_duration("10s") == 10.0
    assert parse_duration("") is None and parse_duration("   ") is None
    assert parse_duration("h") is None and parse_duration("5x") is None
    assert parse_duration("5h junk") is None and parse_duration("x5h") is None
    assert parse_duration("5h5") is None
    dur = lambda t: parse(f"d: {t}\n").mapping()["d"].duration()  # noqa: E731
    assert dur("90") == 90.0 and dur("2.5") == 2.5 and dur("8h") == 8 * 3600.0
    with pytest.raises(ConfigError) as info:
        dur("soon")
    assert info.value.message == ("expected a duration such as 90, '30m', '8h' or '7d', got "
                                  "str 'soon'")
    with pytest.raises(ConfigError) as info:
        dur("true")
    assert "got boolean true" in info.value.message
    with pytest.raises(ConfigError) as info:
        dur("-5")
    assert info.value.message == "must be ≥ 0, got -5"
    assert dur(str(y.MAX_DURATION)) == y.MAX_DURATION
    with pytest.raises(ConfigError) as info:
        dur(str(y.MAX_DURATION + 1))
    assert info.value.message.startswith("must be ≤ ")
    assert dur("36600d") == 36600 * 86400.0
    with pytest.raises(ConfigError) as info:
        dur("36601d")
    assert info.value.message == "a duration is at most 100 years, got '36601d'"


def test_describe():
    assert describe(None) == "nothing (null)"
    assert describe({}) == "a mapping"
    assert describe([]) == "a list"
    assert describe(True) == "boolean true" and describe(False) == "boolean false"
    assert describe(3) == "int 3" and describe("x") == "str 'x'" and describe(1.5) == "float 1.5"


def test_decoding_and_size():
    assert decode("ok") == "ok"
    assert decode(b"ok: 1") == "ok: 1"
    assert decode(b"\xc3\xa9") == "é"
    with pytest.raises(ConfigError) as info:
        decode(b"a: 1\nb: 2\n\xff\n", "f.yaml")
    e = info.value
    assert (e.message, e.line, e.source) == ("not UTF-8 text (byte 0xff at offset 10)", 3,
                                             "f.yaml")
    assert decode("x" * 10, limit=10) == "x" * 10
    with pytest.raises(ConfigError) as info:
        decode("é" * 6, "f.yaml", limit=11)  # 12 bytes
    assert info.value.message == "the file is 0.0 MB; at most 0.0 MB is read"
    with pytest.raises(ConfigError) as info:
        decode(b"x" * 2_500_001, limit=2_000_000)
    assert info.value.message == "the file is 2.5 MB; at most 2.0 MB is read"
    assert decode(b"x" * 11, limit=11) == "x" * 11
    assert y.MAX_BYTES == 1024 * 1024


def test_hostile_documents_are_refused_early():
    assert str(err("")) == "in.yaml:1: the document is empty"
    assert str(err("# only a comment\n")) == "in.yaml:1: the document is empty"
    deep = "a: " + "[" * (y.MAX_DEPTH + 1) + "]" * (y.MAX_DEPTH + 1) + "\n"
    assert err(deep).message == f"nested deeper than {y.MAX_DEPTH} levels"
    ok_deep = "[" * y.MAX_DEPTH + "]" * y.MAX_DEPTH
    assert len(parse(ok_deep).seq()) == 1  # exactly the limit is fine
    aliases = "a: &x 1\nb: [" + ", ".join(["*x"] * (y.MAX_ALIASES + 1)) + "]\n"
    e = err(aliases)
    assert e.message == f"more than {y.MAX_ALIASES} aliases (*name)" and e.line == 2
    assert len(parse("a: &x 1\nb: [" + ", ".join(["*x"] * y.MAX_ALIASES) + "]\n").mapping()[
        "b"].seq()) == y.MAX_ALIASES
    e = err("a: [1, 2\n")
    assert e.message.startswith("not valid YAML: ") and e.line == 2
    assert err("a: 1\n  b: 2\n").message.startswith("not valid YAML")
    e = err("a: &x [*x]\n")
    assert e.message == "recursive YAML alias (a value contains itself)" and e.line == 1
    e = err("base: &b {x: 1}\nthing:\n  <<: *b\n")
    assert e.message == "YAML merge keys (<<) are not supported" and e.line == 3
    e = err("? [1, 2]\n: x\n")
    assert e.message == "expected a plain value here"
    e = err("a: 1\n? null\n: x\n")
    assert e.message == "keys must be names, got nothing (null)" and e.line == 2
    e = err("1: x\n? true\n: y\n")
    assert e.message == "keys must be names, got boolean true"
    assert parse("1: x\n").mapping() == {"1": parse("1: x\n").mapping()["1"]}
    e = err("a: 1\nb: 2\na: 3\n")
    assert (e.message, e.path, e.line) == ("duplicate key 'a' (first at line 1)", "a", 3)
    e = err("a: " + "x" * 10_001 + "\n")
    assert e.message == "a value longer than 10000 characters" and e.path == "a"
    assert len(parse("a: " + "x" * 10_000 + "\n").mapping()["a"].value) == 10_000
    e = err("a: !!int nope\n")
    assert e.message.startswith("bad value: ") and e.line == 1


def test_value_and_event_limits(monkeypatch):
    monkeypatch.setattr(y, "MAX_VALUES", 5)
    assert len(parse("[1, 2, 3, 4]").seq()) == 4  # the list and its 4 values
    e = err("[1, 2, 3, 4, 5]")
    assert e.message == "more than 5 values once aliases are expanded"
    monkeypatch.setattr(y, "MAX_EVENTS", 8)
    e = err("[1, 2, 3, 4]")
    assert e.message == "more than 8 YAML events"


def test_a_node_can_name_its_own_error():
    n = Node(1, 4, "x.y", "s")
    e = n.error("nope")
    assert (str(e), e.line, e.path) == ("s:4: x.y: nope", 4, "x.y")


def whole(text: str | bytes, source: str | None = "in.yaml") -> tuple:
    """An error as (message, dotted path, line, source), all four checked at once."""
    with pytest.raises(ConfigError) as info:
        parse(text, source) if source is not None else parse(text)
    e = info.value
    return (e.message, e.path, e.line, e.source)


def test_every_refusal_names_its_path_line_and_source():
    deep = "a:\n  b: " + "[" * y.MAX_DEPTH + "]" * y.MAX_DEPTH + "\n"
    assert whole(deep) == (f"nested deeper than {y.MAX_DEPTH} levels", "", 2, "in.yaml")
    aliases = "a: &x 1\nb: [" + ", ".join(["*x"] * (y.MAX_ALIASES + 1)) + "]\n"
    assert whole(aliases) == (f"more than {y.MAX_ALIASES} aliases (*name)", "", 2, "in.yaml")
    # libyaml's own wording (the prescan parses with the same loader as the rest)
    assert whole("a: [1, 2\n") == ("not valid YAML: did not find expected ',' or ']'", "", 2,
                                   "in.yaml")
    assert whole("a: [1, 2\n", None)[3] == "<input>"
    # a reader error has no line mark
    assert whole("a: \x07\n") == (
        "not valid YAML: unacceptable character #x0007: control characters are not allowed\n"
        '  in "<unicode string>", position 3', "", None, "in.yaml")
    assert whole("a:\n  b: &x [*x]\n") == ("recursive YAML alias (a value contains itself)",
                                          "a.b[0]", 2, "in.yaml")
    assert whole("a: &x {b: *x}\n") == ("recursive YAML alias (a value contains itself)",
                                       "a.b", 1, "in.yaml")
    assert whole("base: &b {x: 1}\nthing:\n  <<: *b\n") == (
        "YAML merge keys (<<) are not supported", "thing", 3, "in.yaml")
    assert whole("a:\n  ? [1, 2]\n  : x\n") == ("expected a plain value here", "a", 2, "in.yaml")
    assert whole("a:\n  x: 1\n  ? null\n  : x\n") == (
        "keys must be names, got nothing (null)", "a", 3, "in.yaml")
    assert whole("a:\n  b: " + "x" * 10_001 + "\n") == (
        "a value longer than 10000 characters", "a.b", 2, "in.yaml")
    assert whole("a:\n  b: !!int nope\n") == (
        "bad value: invalid literal for int() with base 10: 'nope'", "a.b", 2, "in.yaml")
    assert whole("a:\n  b: 1\n  b: 2\n") == ("duplicate key 'b' (first at line 2)", "a.b", 3,
                                            "in.yaml")


def test_depth_is_counted_down_as_collections_close():
    """Closed collections give their levels back: an empty list three levels down, then
    63 more levels beside it, is 66 deep at most — over 64."""
    text = "[[[[]], " + "[" * 63 + "]" * 63 + "]]"
    assert whole(text) == (f"nested deeper than {y.MAX_DEPTH} levels", "", 1, "in.yaml")


def test_an_anchor_used_again_elsewhere_is_no_recursion():
    m = parse("a:\n  b: &x {k: 1}\n  c: *x\n").mapping()["a"].mapping()
    assert m["c"].mapping()["k"].value == 1
    s = parse("a: &x [1]\nb: *x\n").mapping()
    assert [n.value for n in s["b"].seq()] == [1]


def test_limits_at_their_exact_values(monkeypatch):
    # "[1, 2, 3, 4]" is 10 parser events: stream, document and list start and end, 4 values
    monkeypatch.setattr(y, "MAX_EVENTS", 10)
    assert len(parse("[1, 2, 3, 4]").seq()) == 4
    monkeypatch.setattr(y, "MAX_EVENTS", 9)
    assert whole("[1, 2, 3, 4]")[0] == "more than 9 YAML events"  # at the stream's end
    monkeypatch.setattr(y, "MAX_EVENTS", 5)
    assert whole("[1,\n 2,\n 3]") == ("more than 5 YAML events", "", 3, "in.yaml")  # at 3
    monkeypatch.setattr(y, "MAX_EVENTS", 1_000_000)
    monkeypatch.setattr(y, "MAX_VALUES", 5)
    assert whole("a:\n  - [1, 2, 3, 4]\n") == ("more than 5 values once aliases are expanded",
                                              "a[0][2]", 2, "in.yaml")  # the 6th value


def test_duration_spaces_and_long_texts():
    assert parse_duration("1h 30m") == 5400.0  # spaces between the parts are ignored
    long = "36601d" + "0s" * 30
    with pytest.raises(ConfigError) as info:
        parse(f"d: {long}\n").mapping()["d"].duration()
    assert info.value.message == f"a duration is at most 100 years, got {long[:40]!r}"


def test_decoding_errors_whole():
    with pytest.raises(ConfigError) as info:
        decode(b"x" * 1_050_001, limit=1_050_000)  # 1.050001 MB (and 1.05 MB) show as 1.1
    e = info.value
    assert (e.message, e.path, e.line, e.source) == (
        "the file is 1.1 MB; at most 1.1 MB is read", "", None, "<input>")
    with pytest.raises(ConfigError) as info:
        decode(b"\nx\xff")  # a newline as the very first byte counts
    e = info.value
    assert (e.message, e.path, e.line, e.source) == (
        "not UTF-8 text (byte 0xff at offset 2)", "", 2, "<input>")


def test_errors_found_when_the_document_is_composed():
    # the parser's events are fine; composing them fails
    assert whole("a:\n  b: *nope\n") == ("not valid YAML: found undefined alias", "", 2,
                                       "in.yaml")
    assert whole("a: 1\n--- \nb: 2\n") == ("not valid YAML: but found another document", "",
                                         2, "in.yaml")
    assert whole("a: *nope\n", None)[3] == "<input>"
    # undecodable and oversized input name the source too
    assert whole(b"a: 1\n\xff\n", "f.yaml") == ("not UTF-8 text (byte 0xff at offset 5)", "",
                                              2, "f.yaml")
    with pytest.raises(ConfigError) as info:
        decode(b"x" * 11, "f.yaml", limit=10)
    assert (info.value.path, info.value.line, info.value.source) == ("", None, "f.yaml")
