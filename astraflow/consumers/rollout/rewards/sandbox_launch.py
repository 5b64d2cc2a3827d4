"""The code sandbox's launcher: ``python -I -S sandbox_launch.py CONFIG_JSON``.

Standard library only, no astraflow import: it runs in a fresh interpreter before the untrusted
program, and once it hides the file system it can import nothing more. It carries out what the
worker (:mod:`.sandbox`) decided, passed as JSON. A failed step writes ``error: ...`` to the
status pipe and exits 125, so the worker raises ``SandboxError`` rather than score a setup
failure as the program's. With namespaces the program runs under an init process (PID 1); when
init ends, the kernel kills whatever the program started.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandbox_seccomp  # noqa: E402  (this directory, imported before mounts hide it)

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
_LOCKED = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # + NOATIME, NODIRATIME, RELATIME
NR_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MNT_DETACH = 442, -100, 0x8000, 2
NR_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 22, 24, 28
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SECBITS_LOCKED_NOROOT = 0xEF  # NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE (+ locks), KEEP_CAPS
DEV_NODES = ("null", "zero", "full", "random", "urandom")

LINUX = sys.platform.startswith("linux")
libc = ctypes.CDLL(None, use_errno=True)
if LINUX:
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]


class SetupError(Exception):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {err})")


def _b(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def mount(src: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    _check(libc.mount(_b(src), _b(target), _b(fstype), flags, _b(data)),
           f"mount {src or ''} on {target}")


def fail(status: int, error: BaseException) -> None:
    msg = str(error) if isinstance(error, SetupError) else f"{type(error).__name__}: {error}"
    try:
        os.write(status, f"error: {msg}\n".encode("utf-8", "replace")[:4000])
    finally:
        os._exit(125)


# --- the launcher ----------------------------------------------------------------------------
def main() -> None:
    cfg = json.loads(sys.argv[1])
    status = cfg["status_fd"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        if not cfg["namespaces"]:
            if cfg["isolate_net"]:
                _unshare(CLONE_NEWNET, userns=cfg["userns"])
            program(cfg)  # execs
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        _unshare(flags | (CLONE_NEWNET if cfg["isolate_net"] else 0), userns=cfg["userns"])
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(report_r)
                init(cfg, report_w)
            except BaseException as e:  # noqa: BLE001 - reported to the worker, never raised on
                fail(status, e)
        os.close(report_w)
        os.close(status)
    except BaseException as e:  # noqa: BLE001
        fail(status, e)
    _, raw = os.waitpid(pid, 0)
    with os.fdopen(report_r, "rb") as f:
        report = f.read().strip()
    mirror(int(report) if report else raw)


def _unshare(flags: int, *, userns: bool) -> None:
    """Enter new namespaces; ``userns``: also a user namespace (an unprivileged worker), in which
    this user keeps its uid and gid."""
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(flags | (CLONE_NEWUSER if userns else 0)), "unshare")
    if userns:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def mirror(raw: int) -> None:
    """Exit the way the program did: its status, or the signal that killed it."""
    if os.WIFSIGNALED(raw):
        sig = os.WTERMSIG(raw)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is to be ignored
    os._exit(os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 1)


# --- init: PID 1 of the sandbox's PID namespace ---------------------------------------------
def init(cfg: dict, report: int) -> None:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the launcher died: so do we all
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.umask(0o022)  # the directories made for bind mounts must be enterable by the program
    setup_mounts(cfg)
    pid = os.fork()
    if pid == 0:
        os.close(report)
        program(cfg)
    os.close(cfg["status_fd"])
    raw = 0
    while True:  # reap orphans until the program ends; then the namespace goes with us
        try:
            child, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if child == pid:
            break
    os.write(report, str(raw).encode())
    os._exit(0)


def setup_mounts(cfg: dict) -> None:
    """A new root of the sandbox's own: a tmpfs of ``disk_mb`` (everything the code can write,
    its work directory, /tmp, /var/tmp and /dev/shm, shares that one quota) holding only the
    system directories and the interpreter's (bound read-only), a minimal /dev and a /proc of
    the new PID namespace. Nothing else of the host is visible: not the run directory, not the
    worker's working directory, not home directories."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    work = cfg["work"]
    with open(cfg["script"], "rb") as f:
        script = f.read()
    # the host's work directory is the mount point; what the worker left there (the script,
    # the output files it holds open) stays on the host, out of the sandbox's sight
    root = work
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=0755,size={cfg['disk_mb']}m,nr_inodes={cfg['inodes']}")
    system = list(cfg["system"])
    for path in system:
        bring(path, root, rec_readonly=cfg["readonly"])
    for path in cfg["reach"]:
        if not any(path == s or path.startswith(s.rstrip("/") + "/") for s in system):
            bring(path, root, rec_readonly=cfg["readonly"])
    for path in ("/tmp", "/var/tmp"):
        os.makedirs(root + path, exist_ok=True)
        os.chmod(root + path, 0o1777)
    private_dev(root)
    # mounted before the host's root goes: a user namespace may mount a proc only while a
    # fully visible one is there
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    inside = root + work
    os.makedirs(inside, exist_ok=True)
    target = os.path.join(inside, os.path.basename(cfg["script"]))
    with open(target, "wb") as f:
        f.write(script)
    if cfg["uid"] is not None:
        os.chown(inside, cfg["uid"], cfg["uid"])
        os.chmod(inside, 0o700)
    os.chdir(root)
    _check(libc.syscall(ctypes.c_long(NR_PIVOT_ROOT[platform.machine()]), ctypes.c_char_p(b"."),
                        ctypes.c_char_p(b".")), "pivot_root into the sandbox's own root")
    _check(libc.umount2(b".", MNT_DETACH), "detach the host's root")  # the old root, on top
    os.chdir("/")


def bring(path: str, root: str, *, rec_readonly: bool) -> None:
    """Make host directory ``path`` visible, read-only, at the same path under ``root`` (a
    symbolic link is copied as a link)."""
    if not os.path.lexists(path):
        return
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(path):
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    if not os.path.isdir(path):
        return
    os.makedirs(target, exist_ok=True)
    mount(path, target, None, MS_BIND | MS_REC)
    if rec_readonly:  # the whole tree, submounts included
        attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
        _check(libc.syscall(ctypes.c_long(NR_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD),
                            ctypes.c_char_p(target.encode()), ctypes.c_uint(AT_RECURSIVE),
                            ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
               f"make {path} read-only (mount_setattr, Linux 5.12+)")
        return
    locked = os.statvfs(target).f_flag & _LOCKED  # flags a remount must keep (user namespaces)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_RDONLY | locked)


def private_dev(root: str) -> None:
    """/dev with only null, zero, full, random, urandom (no disks, no terminals), fd links and
    a /dev/shm in the sandbox's tmpfs (its quota)."""
    dev = root + "/dev"
    os.makedirs(dev, exist_ok=True)
    for name in DEV_NODES:
        if not os.path.exists(f"/dev/{name}"):
            continue
        os.close(os.open(f"{dev}/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    os.chmod(f"{dev}/shm", 0o1777)


# --- the program -----------------------------------------------------------------------------
def program(cfg: dict) -> None:
    """Limits, privileges, seccomp, then exec the interpreter on the script (never returns)."""
    status = cfg["status_fd"]
    try:
        for name, value in cfg["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        drop_privileges(cfg["uid"])
        if cfg["seccomp"]:
            install_seccomp(no_fork=cfg["no_fork"],
                            own_pid=os.getpid() if cfg["own_pid"] else None)
        os.chdir(cfg["work"])
        os.set_inheritable(status, False)  # closed by a successful exec
        python = cfg["python"]
        try:
            os.execv(python, [python, "-I", "-B", cfg["script"]])
        except OSError as e:
            raise SetupError(f"cannot run {python}: {e}") from None
    except BaseException as e:  # noqa: BLE001
        fail(status, e)


def drop_privileges(uid: int | None) -> None:
    """No capabilities left, none to regain by exec; ``uid``: also become that user."""
    if not LINUX:  # elsewhere only the rlimits apply (the worker's probe says so)
        return
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the last capability (EPERM: we hold none to drop)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    elif os.geteuid() == 0:
        _check(libc.prctl(PR_SET_SECUREBITS, SECBITS_LOCKED_NOROOT, 0, 0, 0), "securebits")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (x2): all empty
    _check(libc.capset(header, data), "drop capabilities (capset)")
    with open("/proc/self/status") as f:
        caps = {k: v.strip() for k, _, v in (line.partition(":") for line in f)}
    if int(caps.get("CapEff", "0"), 16) or int(caps.get("CapPrm", "0"), 16):
        raise SetupError(f"capabilities remain after dropping them: {caps.get('CapEff')}")


def install_seccomp(*, no_fork: bool, own_pid: int | None) -> None:
    raw = sandbox_seccomp.build(platform.machine(), no_fork=no_fork, own_pid=own_pid)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(raw) // 8, ctypes.addressof(buf))
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.addressof(prog), 0, 0),
           "install the seccomp filter")


if __name__ == "__main__":
    main()
