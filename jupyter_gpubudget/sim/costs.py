"""Measured defaults of the simulator's snapshot and restore costs (no imports: the CLI reads
them for its help text).

From ``bench/snapshot.py``: a kernel holding 1 GiB, CRIU backend end to end (dump + storing the
images as chunks + verification; chunks back into images + ``criu restore`` + the kernel
answering), the slowest of three runs on the shared 2-core development machine:
dump 8.9 s + verify 2.9 s -> 12 s; restore 6.0 s -> 6 s. The namespace backend was faster in
every run (dump 2.6-6.5 s, restore 0.9-3.2 s), so these are the cautious figures.
"""

SNAPSHOT_COST_S = 12.0  # seconds to snapshot a preempted interactive session
RESTORE_COST_S = 6.0  # seconds to restore it
