"""Run a command with ptrace refused, as in a pod without CAP_SYS_PTRACE on a host with Yama
scope 1 (Ubuntu's default): there the kernel refuses, with EPERM, the three ways py-spy reads
another process (ptrace attach, process_vm_readv, /proc/PID/mem: PTRACE_MODE_ATTACH), while
/proc/PID/status and /proc/PID/environ of the user's own processes stay readable
(PTRACE_MODE_READ). Here a seccomp filter, inherited by every child, refuses ptrace(2) and
process_vm_readv(2) with EPERM, and the legacy open(2): seccomp cannot filter a path, and
py-spy's static (musl) build opens /proc/PID/mem with open(2), where CPython (glibc) opens
every file with openat(2), so triage itself reads /proc as in the pod. x86_64 only (aarch64 has
no open(2)). Not collected by pytest (no test_ prefix).

`python no_ptrace.py COMMAND [ARGS...]`
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

# arch -> (AUDIT_ARCH_*, ptrace, process_vm_readv, open)
ARCHES = {"x86_64": (0xC000003E, 101, 310, 2)}
LD_ABS, JEQ, RET = 0x20, 0x15, 0x06
ALLOW, EPERM = 0x7FFF0000, 0x00050000 | 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def install() -> None:
    arch, ptrace, vm_readv, legacy_open = ARCHES[platform.machine()]
    program = b"".join(
        [
            _insn(LD_ABS, 0, 0, 4),  # seccomp_data.arch
            _insn(JEQ, 0, 6, arch),  # another ABI: allow
            _insn(LD_ABS, 0, 0, 0),  # seccomp_data.nr
            _insn(JEQ, 3, 0, ptrace),
            _insn(JEQ, 2, 0, vm_readv),
            _insn(JEQ, 1, 0, legacy_open),
            _insn(RET, 0, 0, ALLOW),
            _insn(RET, 0, 0, EPERM),
            _insn(RET, 0, 0, ALLOW),
        ]
    )
    buf = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxP", len(program) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    ulong = ctypes.c_ulong
    libc.prctl.argtypes = [ctypes.c_int, ulong, ulong, ulong, ulong]  # an address is 64 bits
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    fbuf = ctypes.create_string_buffer(fprog)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fbuf), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


if __name__ == "__main__":
    install()
    os.execvp(sys.argv[1], sys.argv[1:])
