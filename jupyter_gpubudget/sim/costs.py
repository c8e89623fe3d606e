"""Measured defaults of the simulator's snapshot and restore costs (no imports: the CLI reads
them for its help text; the service uses them for a session with no snapshot history yet).

From ``bench/snapshot.py`` (its 1 GiB case): a kernel holding 1 GiB, CRIU backend end to end
(dump + storing the images as chunks, each fdatasynced + the verified commit; chunks back into
images + ``criu restore`` + the kernel answering), random and structured data, over four runs
on the shared 2-core development machine: quiet (load 1.2-2.5, disk 1.7-2.7 GB/s): dump
1.5-2.7 s, restore 1.6-2.0 s; loaded (load 4-7, disk 250-1200 MB/s): dump 4.5-8.8 s, restore
2.9-7.0 s. The defaults are the slowest figures, rounded up. The namespace backend was faster
in every run (dump 0.8-5.4 s, restore 0.8-3.3 s).
"""

SNAPSHOT_COST_S = 9.0  # seconds to snapshot a preempted interactive session
RESTORE_COST_S = 7.0  # seconds to restore it
