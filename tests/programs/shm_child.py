"""A role-like process tree that holds POSIX shared memory as a generator does (vLLM's EngineCore
creates its message-queue segments): run by tests/integration/launch/test_child_leftovers.py.

    python -m tests.programs.shm_child NAMEFILE [ALLOC_MB]

The child starts a grandchild that creates one segment and writes its name to NAMEFILE, then
sleeps; with ALLOC_MB the child then fills that much memory (to be OOM-killed in a small cgroup).
"""

import os
import subprocess
import sys
import time

GRANDCHILD = """
import sys, time
from multiprocessing import shared_memory
shm = shared_memory.SharedMemory(create=True, size=4 << 20)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(shm.name)
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""

if __name__ == "__main__":
    engine = subprocess.Popen([sys.executable, "-c", GRANDCHILD, sys.argv[1]])
    if len(sys.argv) > 2:
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        hog = bytearray(int(sys.argv[2]) << 20)  # zero-filled: every page is really touched
    time.sleep(600)
