"""The user namespace a sandbox gets when streamrl runs as root.

bwrap's own --unshare-user maps the sandbox's uid to the caller's, so under root the sandboxed code would
be host uid 0: the kernel then exempts it from RLIMIT_NPROC and lets it write root-owned files it can see,
/proc/sys among them (kernel.core_pattern is a host escape). Instead, per run, a namespace is made here
that maps 0 -> 0 (bwrap needs it to build the mounts: it reads the runtime paths as root) and
SANDBOX_UID -> SANDBOX_UID; bwrap runs in it (nsenter), and the bootstrap switches to SANDBOX_UID before any
model code runs, so that code is host uid 65534 with no capabilities anywhere.

    fd = root_userns()     # an open /proc/<pid>/ns/user; close it once bwrap has started
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

SANDBOX_UID = 65534  # nobody
SETUP_TIMEOUT_S = 5.0


class UsernsError(RuntimeError):
    pass


def tools_missing() -> str | None:
    """None when util-linux's unshare and nsenter are on PATH (root mode needs both)."""
    missing = [t for t in ("unshare", "nsenter") if shutil.which(t) is None]
    return f"{' and '.join(missing)} (util-linux) not on PATH" if missing else None


def root_userns() -> int:
    """A fresh user namespace with the two mappings, held open by the returned fd (its maker is gone)."""
    mine = os.readlink("/proc/self/ns/user")
    # `unshare --user` creates the namespace and then waits in `sleep` for us to write its maps: only a
    # process outside it, with CAP_SETUID here (root), may map host uids other than its creator's.
    holder = subprocess.Popen(
        ["unshare", "--user", "sleep", "30"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        close_fds=True,
    )
    try:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            try:
                if os.readlink(f"/proc/{holder.pid}/ns/user") != mine:
                    break
            except OSError:
                pass
            if holder.poll() is not None:
                err = holder.stderr.read().decode(errors="replace").strip()
                raise UsernsError(f"`unshare --user` failed: {err or f'exit code {holder.returncode}'}")
            if time.monotonic() > deadline:
                raise UsernsError(f"`unshare --user` made no user namespace in {SETUP_TIMEOUT_S:.0f}s")
            time.sleep(0.0005)
        maps = f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w") as f:
                f.write(maps)
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.kill()
        holder.wait()
        holder.stderr.close()
