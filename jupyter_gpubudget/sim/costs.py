"""Measured defaults of the simulator's snapshot and restore costs (no imports: the CLI reads
them for its help text).

From ``bench/snapshot.py``: a kernel holding 1 GiB, CRIU backend end to end (dump + storing the
images as chunks + verification; chunks back into images + ``criu restore`` + the kernel
answering), over five runs on the shared 2-core development machine (load 4-7, disk 240-1200
MB/s): dump + verify 5.3-13.9 s, restore 2.7-9.7 s. The defaults are the slowest figures,
rounded up. The namespace backend was faster in every run (dump 2.6-6.8 s, restore 0.9-3.3 s).
"""

SNAPSHOT_COST_S = 14.0  # seconds to snapshot a preempted interactive session
RESTORE_COST_S = 10.0  # seconds to restore it
