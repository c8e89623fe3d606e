"""The hostile budgets files of the security review, written to a directory: each must get a clear
``file:line`` error from ``gpubudget budgets check`` quickly and in little memory. Used by
tests/security/test_budgets_check.py and bench/budgets_check.py (which measures them)."""

from __future__ import annotations

from pathlib import Path


def write_all(d: Path) -> dict[str, tuple[Path, int | None]]:
    """name -> (file, the line the error must name, or None when the file as a whole is
    refused)."""
    out: dict[str, tuple[Path, int | None]] = {}

    def put(name: str, data: bytes | str, line: int | None) -> None:
        p = d / f"{name}.yaml"
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        out[name] = (p, line)

    put("non-utf8", b"accounts:\n  physics: {grant: 1}\n  bio\xff: {grant: 2}\n", 3)
    put("grant-1e400", "accounts:\n  physics: {grant: 1e400}\n", 2)
    put("grant-huge-float", "accounts:\n  physics: {grant: 1.0e+400}\n", 2)
    put("grant-400-digits", "accounts:\n  physics: {grant: 1" + "0" * 400 + "}\n", 2)
    put("grant-5000-digits", "accounts:\n  physics: {grant: 1" + "0" * 5000 + "}\n", 2)
    lines, indent = ["accounts:"], "  "
    for i in range(500):  # 500-deep children:
        lines += [f"{indent}a{i}:", f"{indent}  children:"]
        indent += "    "
    lines.append(f"{indent}leaf: {{grant: 1}}")
    put("children-500-deep", "\n".join(lines) + "\n", 65)
    bomb = ["x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):  # 9**10 values once expanded
        bomb.append(f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    put("alias-bomb", "\n".join(bomb) + "\naccounts:\n  a: {grant: 1}\n", 1)
    chain = ["accounts:", "  a0: {grant: 1}"] + [f"  a{i}: {{parent: a{i - 1}}}"
                                                  for i in range(1, 10_000)]
    put("parent-chain-10000", "\n".join(chain) + "\n", 34)
    put("ten-megabytes", "accounts:\n" + "".join(
        f"  p{i}: {{grant: 1, members: [u{i}]}}\n" for i in range(330_000)), None)
    put("window-400-digits", "window: " + "9" * 400 + "d\naccounts:\n  a: {grant: 1}\n", 1)
    put("window-400-digit-seconds", "window: " + "9" * 400 + "\naccounts:\n  a: {grant: 1}\n",
        1)
    return out
