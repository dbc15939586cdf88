"""A seccomp filter for the Python sandbox, compiled to classic BPF here (no libseccomp needed) and handed to
bubblewrap (`bwrap --seccomp FD`), which installs it right before the sandboxed interpreter starts.

    program = seccomp_program()   # bytes (struct sock_filter[]), None on an unknown architecture

It refuses (EPERM) the syscalls a sandboxed script has no use for and that are the kernel's usual attack
surface or a way out: ptrace, mount and the new mount API, namespaces (unshare, setns, clone with CLONE_NEW*),
kernel modules, kexec, bpf, perf_event_open, userfaultfd, io_uring, keyrings, process_vm_*, open_by_handle_at,
the clocks, swap, reboot. clone3 gets ENOSYS (its flags live in memory a filter cannot read; glibc falls
back to clone, whose flags it can). A syscall from another ABI (x32, or a foreign audit arch) kills the
process.
"""

from __future__ import annotations

import errno
import platform
import struct

_DENY = [
    "ptrace",
    "mount",
    "umount2",
    "pivot_root",
    "swapon",
    "swapoff",
    "reboot",
    "sethostname",
    "setdomainname",
    "iopl",
    "ioperm",
    "init_module",
    "finit_module",
    "delete_module",
    "quotactl",
    "acct",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "process_vm_readv",
    "process_vm_writev",
    "open_by_handle_at",
    "name_to_handle_at",
    "syslog",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "clock_adjtime",
    "vhangup",
    "lookup_dcookie",
]

# Numbers from the kernel's uapi headers (asm/unistd_64.h; asm-generic/unistd.h for arm64): a stable ABI.
_X86_64 = {
    "ptrace": 101,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "quotactl": 179,
    "acct": 163,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "unshare": 272,
    "setns": 308,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    "syslog": 103,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "move_mount": 429,
    "open_tree": 428,
    "mount_setattr": 442,
    "settimeofday": 164,
    "clock_settime": 227,
    "adjtimex": 159,
    "clock_adjtime": 305,
    "vhangup": 153,
    "lookup_dcookie": 212,
    "clone": 56,
    "clone3": 435,
}
_AARCH64 = {
    "ptrace": 117,
    "mount": 40,
    "umount2": 39,
    "pivot_root": 41,
    "swapon": 224,
    "swapoff": 225,
    "reboot": 142,
    "sethostname": 161,
    "setdomainname": 162,
    "init_module": 105,
    "finit_module": 273,
    "delete_module": 106,
    "quotactl": 60,
    "acct": 89,
    "kexec_load": 104,
    "kexec_file_load": 294,
    "bpf": 280,
    "perf_event_open": 241,
    "userfaultfd": 282,
    "keyctl": 219,
    "add_key": 217,
    "request_key": 218,
    "unshare": 97,
    "setns": 268,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "open_by_handle_at": 265,
    "name_to_handle_at": 264,
    "syslog": 116,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "move_mount": 429,
    "open_tree": 428,
    "mount_setattr": 442,
    "settimeofday": 170,
    "clock_settime": 112,
    "adjtimex": 171,
    "clock_adjtime": 266,
    "vhangup": 58,
    "lookup_dcookie": 18,
    "clone": 220,
    "clone3": 435,
}
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64), "arm64": (0xC00000B7, _AARCH64)}

_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data; args[0]'s low 32 bits (little endian)
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
_X32_BIT = 0x40000000


def supported() -> bool:
    return platform.machine() in _ARCHES


def seccomp_program() -> bytes | None:
    """The filter as bwrap reads it (an array of struct sock_filter), or None on an architecture
    without a syscall table here."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, nr = arch
    ops: list[tuple[int, object, object, int]] = [  # (code, jump-if-true label, jump-if-false label, k)
        (_LD_ABS_W, 0, 0, _OFF_ARCH),
        (_JEQ, 0, "kill", audit_arch),
        (_LD_ABS_W, 0, 0, _OFF_NR),
    ]
    if audit_arch == 0xC000003E:
        ops.append((_JGE, "kill", 0, _X32_BIT))
    ops += [(_JEQ, "eperm", 0, nr[name]) for name in _DENY if name in nr]
    ops += [(_JEQ, "clone", 0, nr["clone"]), (_JEQ, "enosys", 0, nr["clone3"])]
    ops.append((_RET, 0, 0, _ALLOW))
    labels = {"clone": len(ops)}
    ops += [(_LD_ABS_W, 0, 0, _OFF_ARG0), (_JSET, "eperm", 0, _CLONE_NEW), (_RET, 0, 0, _ALLOW)]
    for label, ret in (("eperm", _ERRNO | errno.EPERM), ("enosys", _ERRNO | errno.ENOSYS), ("kill", _KILL_PROCESS)):
        labels[label] = len(ops)
        ops.append((_RET, 0, 0, ret))
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(ops):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise AssertionError(f"seccomp jump out of range at {i}")  # a bug in the table above, not input
        out += struct.pack("<HBBI", code, jt, jf, k)
    return bytes(out)
