"""The code sandbox's seccomp filter, as classic BPF (no libseccomp needed).

Standard library only: :mod:`.sandbox_launch` imports it by file path before the sandboxed
program starts. The filter kills a process that uses a foreign syscall ABI (``int 0x80``, x32),
fails with ``EPERM`` the calls that reach outside the sandbox (namespaces, ``ptrace``,
mounting, ``bpf``, ``io_uring`` and the like), fails ``clone3`` with ``ENOSYS`` (libc falls back
to ``clone``, whose flags it can read) and, where asked, refuses new processes (``no_fork``)
and signals to other processes (``own_pid``).
"""

from __future__ import annotations

import struct

ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_*
X32_BIT = 0x40000000

# name: (x86_64, aarch64); None where the call does not exist
_NR: dict[str, tuple[int | None, int | None]] = {
    "fork": (57, None), "vfork": (58, None), "clone": (56, 220), "clone3": (435, 435),
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131),
    "pidfd_send_signal": (424, 424), "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240),
}
BLOCKED: dict[str, tuple[int | None, int | None]] = {
    "setns": (308, 268), "unshare": (272, 97), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "chroot": (161, 51), "mount_setattr": (442, 442),
    "move_mount": (429, 429), "open_tree": (428, 428), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "bpf": (321, 280),
    "perf_event_open": (298, 241), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "userfaultfd": (323, 282), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "swapon": (167, 224),
    "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89), "quotactl": (179, 60),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266),
    "adjtimex": (159, 171), "syslog": (103, 116), "iopl": (172, None), "ioperm": (173, None),
}
CLONE_THREAD = 0x00010000
CLONE_NEW = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
             | 0x40000000 | 0x00000080)  # NS, CGROUP, UTS, IPC, USER, PID, NET, TIME
EPERM, EAGAIN, ENOSYS = 1, 11, 38

_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|K, RET|K
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000


def supported(machine: str) -> bool:
    return machine in ARCH


def build(machine: str, *, no_fork: bool = False, own_pid: int | None = None) -> bytes:
    """The filter for ``machine`` (``platform.machine()``) as packed ``sock_filter``s."""
    if machine not in ARCH:
        raise ValueError(f"no seccomp filter for {machine!r}; supported: {sorted(ARCH)}")
    col = 0 if machine == "x86_64" else 1

    def nr(name: str) -> int | None:
        return (_NR.get(name) or BLOCKED[name])[col]

    prog: list[tuple[int, int | str, int | str, int]] = []  # (code, jt, jf, k)
    labels: dict[str, int] = {}  # name -> index of the instruction that follows it

    def op(code: int, k: int | None = 0, jt: int | str = 0, jf: int | str = 0) -> None:
        assert k is not None
        prog.append((code, jt, jf, k))

    def label(name: str) -> None:
        labels[name] = len(prog)

    op(_LD, 4)  # seccomp_data.arch
    op(_JEQ, ARCH[machine], 0, "kill")
    op(_LD, 0)  # seccomp_data.nr
    if machine == "x86_64":
        op(_JGE, X32_BIT, "kill", 0)
    op(_JEQ, nr("clone3"), "enosys", 0)
    op(_JEQ, nr("clone"), "clone", 0)
    for name in ("fork", "vfork"):
        n = nr(name)
        if n is not None:
            op(_JEQ, n, "eagain" if no_fork else "allow", 0)
    for name in BLOCKED:
        n = nr(name)
        if n is not None:
            op(_JEQ, n, "eperm", 0)
    if own_pid is not None:
        for name in ("tkill", "pidfd_send_signal", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
            op(_JEQ, nr(name), "eperm", 0)
        op(_JEQ, nr("kill"), "signal", 0)
        op(_JEQ, nr("tgkill"), "signal", 0)
    op(_RET, RET_ALLOW)
    label("clone")
    op(_LD, 16)  # args[0] (flags), low 32 bits on little-endian machines
    op(_JSET, CLONE_NEW, "eperm", 0)
    if no_fork:
        op(_JSET, CLONE_THREAD, "allow", "eagain")
    op(_RET, RET_ALLOW)
    if own_pid is not None:
        label("signal")
        op(_LD, 16)  # args[0]: the pid (kill) or thread group (tgkill)
        op(_JEQ, own_pid, "allow", 0)
        op(_JEQ, 0, "allow", "eperm")
    label("allow")
    op(_RET, RET_ALLOW)
    label("kill")
    op(_RET, RET_KILL_PROCESS)
    label("eperm")
    op(_RET, RET_ERRNO | EPERM)
    label("eagain")
    op(_RET, RET_ERRNO | EAGAIN)
    label("enosys")
    op(_RET, RET_ERRNO | ENOSYS)

    out = []
    for pc, (code, jt, jf, k) in enumerate(prog):
        offsets = []
        for target in (jt, jf):
            off = labels[target] - pc - 1 if isinstance(target, str) else target
            if not 0 <= off <= 255:
                raise AssertionError(f"seccomp jump of {off} at {pc}")
            offsets.append(off)
        out.append(struct.pack("=HBBI", code, offsets[0], offsets[1], k))
    return b"".join(out)
