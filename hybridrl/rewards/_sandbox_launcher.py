"""Privileged half of the code sandbox; runs as `python -I -S _sandbox_launcher.py CONFIG_JSON`.

Standard library only (it runs with site-packages disabled). Steps, as root:
  1. new mount, network, PID, IPC and UTS namespaces (unshare(2));
  2. fork: the child is PID 1 (init) of the new PID namespace, so when it exits the kernel kills every
     process left behind (a fork bomb dies with it); the solution runs as its child;
  3. the child mounts a fresh /proc (host processes become invisible), puts small throwaway tmpfs over
     world-writable directories and the home directory, binds the work directory and the Python
     installation back in, sets resource limits, drops to an unprivileged uid and execs the solution.
The launcher reports the init's host pid, and the init the solution's exit status and resource use, as
JSON lines on the status file descriptor, so the host can kill the namespace and classify the outcome.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_NAMESPACES = {"mount": CLONE_NEWNS, "network": CLONE_NEWNET, "pid": CLONE_NEWPID,
               "ipc": CLONE_NEWIPC, "uts": CLONE_NEWUTS}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _report(fd, **fields):
    os.write(fd, (json.dumps(fields) + "\n").encode())


def _enter_namespaces(wanted):
    """unshare each wanted namespace on its own so one the OS refuses does not block the others."""
    entered = {}
    for name in wanted:
        entered[name] = _libc.unshare(ctypes.c_int(_NAMESPACES[name])) == 0
    return entered


def _bind(fd, target, readonly):
    os.makedirs(target, exist_ok=True)
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    if readonly:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_filesystem(cfg, entered):
    if not entered.get("mount"):
        return
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # our mounts must not propagate to the host
    # Handles to what we bind back later, taken inside the new mount namespace (a bind source must
    # belong to the caller's namespace) and before tmpfs hides the paths.
    workdir_fd = os.open(cfg["workdir"], os.O_PATH | os.O_DIRECTORY)
    expose_fds = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in cfg["expose_paths"]]
    if entered.get("pid"):
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV)
    size = f"size={cfg['tmpfs_bytes']}"
    for path in cfg["hidden_paths"]:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    for path, fd in expose_fds:
        _bind(fd, path, readonly=True)
    _bind(workdir_fd, cfg["sandbox_dir"], readonly=False)
    for fd in [workdir_fd] + [fd for _, fd in expose_fds]:
        os.close(fd)


def _set_limits(cfg):
    cpu = cfg["cpu_seconds"]
    # Soft limit sends SIGXCPU, the hard limit one second later SIGKILL (in case SIGXCPU is caught).
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, key in (("RLIMIT_AS", "address_space_bytes"), ("RLIMIT_NPROC", "max_processes"),
                      ("RLIMIT_FSIZE", "file_size_bytes"), ("RLIMIT_NOFILE", "max_open_files")):
        value = cfg[key]
        resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child(cfg, entered, status_fd):
    """PID 1 of the sandbox: finish the isolation, then exec the solution. Never returns."""
    try:
        stdin_fd = os.open(cfg["stdin_path"], os.O_RDONLY)  # before the work dir moves
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        os.unlink(cfg["stdin_path"])
        _build_filesystem(cfg, entered)
        workdir = cfg["sandbox_dir"] if entered.get("mount") else cfg["workdir"]
        uid = cfg["uid"]
        if uid is not None:
            os.chown(workdir, uid, uid)
        _set_limits(cfg)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        # Set after setuid: a credential change clears the parent-death signal.
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        os.chdir(workdir)
    except BaseException as err:  # report why the sandbox could not start, then die without cleanup
        _report(status_fd, setup_error=f"{type(err).__name__}: {err}")
        os._exit(127)
    _init(cfg, status_fd)


def _init(cfg, status_fd):
    """Stay as PID 1 and run the solution as PID 2.

    The kernel ignores default-action signals sent to a namespace's init (SIGXCPU included), so the
    solution must not be PID 1 itself. This init reaps orphans, reports the solution's exit status and
    resource use, then exits, which kills whatever the solution left running.
    """
    pid = os.fork()
    if pid == 0:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        argv = [cfg["python"], *cfg["python_flags"], cfg["script"]]
        try:
            os.execve(cfg["python"], argv, {})
        finally:
            os._exit(127)
    while True:
        try:
            reaped, wait_status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if reaped == pid:
            break
    _report(status_fd, exit_code=os.waitstatus_to_exitcode(wait_status),
            cpu_time=usage.ru_utime + usage.ru_stime, max_rss_kb=usage.ru_maxrss)
    os._exit(0)


def main():
    cfg = json.loads(sys.argv[1])
    status_fd = cfg["status_fd"]
    os.set_inheritable(status_fd, False)  # the solution must not be able to forge our report
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # host gone -> launcher gone -> sandbox gone
    entered = _enter_namespaces(cfg["namespaces"])
    missing = [name for name, ok in entered.items() if not ok]
    if missing and cfg["require_isolation"]:
        _report(status_fd, isolation=entered, setup_error=f"cannot create namespaces: {missing}")
        return 127
    pid = os.fork()
    if pid == 0:
        _child(cfg, entered, status_fd)
    _report(status_fd, isolation=entered, child_pid=pid)
    os.waitpid(pid, 0)  # the init reports the solution's status itself
    return 0


if __name__ == "__main__":
    sys.exit(main())
