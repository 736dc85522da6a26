"""First stage of a sandbox run with namespaces (``root`` and ``userns`` modes): layers 3 and 4 of ``code_sandbox``.

``code_sandbox`` runs it as ``python -I -S -c <source> MODE UID WORKDIR TMPFS HARNESS-ARGV...`` as the root of the run's
fresh namespaces, before anything of the program runs; it is never imported. It mounts a fresh tmpfs (options
``TMPFS``) on each world-writable folder and on the work folder, in the run's own mount namespace, so they vanish with
it; then it drops the privileges: no new privileges on exec (a set-uid program) in both modes, a fresh uid in ``root``
mode, the capabilities and their bounding set in ``userns`` mode (the namespace's root could otherwise unmount the
tmpfs). Then it execs the harness (``HARNESS-ARGV``), as that user: exec recomputes the capabilities, and the
interpreter is opened before the uid changes (it may lie under a home folder the new uid cannot enter). Any failure
raises, the harness never starts, and the probe (``code_sandbox.isolation_mode``) falls back to a weaker mode. Only
``os``, ``sys`` and ``_ctypes``: this runs before every program, and imports cost time.
"""

import _ctypes  # not ctypes: importing it would cost every run 2 to 3 ms more; the three C calls need only this
import os
import sys

PRIVATE_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # the world-writable folders of a Linux system
MS_NOSUID, MS_NODEV, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, CAPABILITY_VERSION_3 = 2, 4, 38, 24, 0x20080522


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
    """``name(*args)`` of the C library; raises OSError when it returns nonzero."""
    if Function((name, CLibrary))(*args) != 0:
        raise OSError(_ctypes.get_errno(), "sandbox isolation: " + name)


def main():
    mode, uid, workdir, tmpfs, *harness = sys.argv[1:]
    uid = int(uid)

    def mount(folder, options):
        call("mount", b"mlmt-sandbox", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode())

    for folder in sorted({os.path.realpath(folder) for folder in PRIVATE_FOLDERS if os.path.isdir(folder)}):
        mount(folder, tmpfs + ",mode=1777")  # a link (/var/tmp -> /tmp) is followed, each folder mounted once
    os.makedirs(workdir, exist_ok=True)  # inside the fresh /tmp, or the parent's folder elsewhere
    owner = str(uid if mode == "root" else 0)
    mount(workdir, tmpfs + ",mode=700,uid=" + owner + ",gid=" + owner)
    os.chdir(workdir)
    interpreter = os.open(os.path.realpath(harness[0]), os.O_RDONLY)
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
