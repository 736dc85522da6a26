"""First stage of a sandbox run with namespaces (``root`` and ``userns`` modes): layers 3 and 4 of ``code_sandbox``.

``code_sandbox`` runs it as ``python -I -S -c <source> MODE UID WORKDIR TMPFS VIEW HIDDEN HARNESS-ARGV...`` as the root
of the run's fresh namespaces, before anything of the program runs; it is never imported. In the run's own mount
namespace it builds the program's filesystem: a fresh, empty tmpfs becomes the root (``pivot_root``; the host's root
is detached, so no path leads back to it), holding only ``VIEW`` (newline-separated host paths: the interpreter, its
standard library and the system's shared libraries), bound read-only at their own paths, with the folders of
``HIDDEN`` (the interpreter's ``site-packages``) covered by an empty read-only tmpfs, a few devices (``/dev/null``,
``/dev/urandom``, ...), the run's ``/proc``, and a fresh writable tmpfs (options ``TMPFS``) on each world-writable
folder and on the work folder, so that they vanish with the namespace. Then it drops the privileges: no new privileges
on exec (a set-uid program) in both modes, a fresh uid in ``root`` mode, the capabilities and their bounding set in
``userns`` mode (the namespace's root could otherwise unmount what hides the host). Then it execs the harness
(``HARNESS-ARGV``), as that user: exec recomputes the capabilities. Any failure raises, the harness never starts, and
the probe (``code_sandbox.isolation_mode``) finds the mode unavailable. Only ``os``, ``sys`` and ``_ctypes``: this runs
before every program, and imports cost time.
"""

import _ctypes  # not ctypes: importing it would cost every run 2 to 3 ms more; the C calls need only this
import os
import sys

PRIVATE_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # the world-writable folders of a Linux system
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MNT_DETACH = 1, 2, 4, 32, 4096, 16384, 2
# a bind mount's flags a user namespace may not clear (nosuid, nodev, noexec, the atime flags): kept on remount
LOCKED_FLAGS = 2 | 4 | 8 | 1024 | 2048 | 4096
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, CAPABILITY_VERSION_3 = 38, 24, 0x20080522
# pivot_root's system call number per machine: the C library has no wrapper
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


class Int(_ctypes._SimpleCData):  # ctypes.c_int
    _type_ = "i"


class UInt32Array(_ctypes.Array):  # ctypes.c_uint32 * 6
    _type_ = type("UInt32", (_ctypes._SimpleCData,), {"_type_": "I"})
    _length_ = 6


class Function(_ctypes.CFuncPtr):  # a function of the C library: ctypes.CDLL(None, use_errno=True)[name]
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = Int


class CLibrary:
    _handle = _ctypes.dlopen(None)


def call(name, *args):
    """``name(*args)`` of the C library; raises OSError naming the call and its first argument when it fails."""
    if Function((name, CLibrary))(*args) != 0:
        raise OSError(_ctypes.get_errno(), "sandbox isolation: " + name + " " + str(args[:2]))


def mount_tmpfs(folder, options, flags=0):
    call("mount", b"mlmt-sandbox", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | flags, options.encode())


def bind_read_only(source, target, flags):
    """Binds the host's ``source`` on ``target`` (a folder or file made for it) read-only, with ``flags`` added."""
    call("mount", source.encode(), target.encode(), None, MS_BIND | MS_REC, None)
    kept = os.statvfs(source).f_flag & LOCKED_FLAGS
    call("mount", None, target.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept | flags, None)


def expose(path, root):
    """Makes the host's ``path`` appear at the same place under ``root``: a link as the same link, a folder or file
    bound read-only."""
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(path):  # /lib -> usr/lib on a merged /usr
        os.symlink(os.readlink(path), target)
    elif os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
        bind_read_only(path, target, MS_NOSUID | MS_NODEV)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        bind_read_only(path, target, MS_NOSUID if path.startswith("/dev/") else MS_NOSUID | MS_NODEV)


def build_root(root, view, hidden, workdir, tmpfs, owner):
    """The program's filesystem under ``root`` (an empty folder): see the module docstring."""
    mount_tmpfs(root, "size=1m,nr_inodes=1024,mode=755")
    for path in view:
        expose(path, root)
    for path in hidden:
        mount_tmpfs(root + path, "size=4k,nr_inodes=2,mode=755", MS_RDONLY)
    for device in DEVICES:
        if os.path.exists(device):
            expose(device, root)
    os.makedirs(root + "/proc")
    call("mount", b"/proc", (root + "/proc").encode(), None, MS_BIND | MS_REC, None)  # the PID namespace's own
    for folder in sorted({os.path.realpath(folder) for folder in PRIVATE_FOLDERS if os.path.isdir(folder)}):
        os.makedirs(root + folder, exist_ok=True)  # a link (/var/tmp -> /tmp) is followed, each folder made once
        mount_tmpfs(root + folder, tmpfs + ",mode=1777")
    os.makedirs(root + workdir, exist_ok=True)
    mount_tmpfs(root + workdir, tmpfs + ",mode=700,uid=" + owner + ",gid=" + owner)


def enter_root(root):
    """Makes ``root`` the root of this mount namespace and detaches the host's (``pivot_root(2)``'s own idiom)."""
    os.chdir(root)
    call("syscall", SYS_PIVOT_ROOT[os.uname().machine], b".", b".")  # another machine: KeyError, mode unavailable
    call("umount2", b".", MNT_DETACH)
    os.chdir("/")
    call("mount", None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def main():
    mode, uid, workdir, tmpfs, view, hidden, *harness = sys.argv[1:]
    uid = int(uid)
    os.umask(0o022)
    owner = str(uid if mode == "root" else 0)
    build_root(workdir, view.split("\n"), hidden.split("\n") if hidden else [], workdir, tmpfs, owner)
    enter_root(workdir)
    os.chdir(workdir)
    interpreter = os.open(harness[0], os.O_RDONLY)
    call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if mode == "root":
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # leaving uid 0 clears every capability
    else:
        for capability in range(64):
            try:
                call("prctl", PR_CAPBSET_DROP, capability, 0, 0, 0)
            except OSError:  # past the kernel's last capability (EINVAL)
                break
        call("capset", UInt32Array(CAPABILITY_VERSION_3, 0), UInt32Array())  # header (version, this process), data 0
    os.execve(interpreter, harness, os.environ)


if __name__ == "__main__":
    main()
