"""The state every snapshot test defines in a real kernel, and the checks run in the restored
one: each check prints one line ``name ok`` or raises."""

from __future__ import annotations


def cells(tmp: str, mib: int) -> list[str]:
    n = mib * (1 << 20) // 8
    return [
        "import numpy as np\nimport pandas as pd",
        # float64 values with a little structure (ints below 2**31): compressible, like most
        # real data; the checksum is computed in the kernel before the snapshot
        f"big = np.arange({n}, dtype=np.float64) % 2147483647\n"
        "big[::4097] = np.random.default_rng(7).random(big[::4097].shape[0])\n"
        "big_sum = float(big.sum()); big_tail = big[-3:].tolist()",
        "frame = pd.DataFrame({'x': np.arange(1000), 'label': [f'r{i}' for i in range(1000)],"
        " 'when': pd.date_range('2026-01-01', periods=1000, freq='h')})",
        "def scaled(v, k=3):\n    return v * k + offset",
        "offset = 0.5",
        "class Counter:\n    def __init__(self, start):\n        self.n = start\n"
        "    def bump(self):\n        self.n += 1\n        return self.n",
        "counter = Counter(40)\ncounter.bump()",
        f"handle = open({tmp + '/notes.txt'!r}, 'w')\nhandle.write('kept open')",
        "squares = (i * i for i in range(6))",
    ]


CHECKS = """
assert float(big.sum()) == big_sum and big[-3:].tolist() == big_tail, 'big'
print('big ok', big.nbytes)
assert frame.shape == (1000, 3) and frame['label'][999] == 'r999', 'frame'
assert str(frame['when'].iloc[-1]) == '2026-02-11 15:00:00', 'frame when'
print('frame ok')
assert scaled(2) == 6.5 and scaled(1, k=10) == 10.5, 'scaled'
print('scaled ok')
assert isinstance(counter, Counter) and counter.n == 41 and counter.bump() == 42, 'counter'
print('counter ok')
"""
