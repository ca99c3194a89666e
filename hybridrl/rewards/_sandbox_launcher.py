"""Privileged half of the code sandbox: `python -I -S _sandbox_launcher.py CONFIG_JSON` (stdlib only). As
root it unshares the namespaces and forks the init (PID 1, whose exit kills every process left), which
builds the filesystem and forks the solution; both report as JSON lines on the status fd (SANDBOX.md)."""

import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 38, 36
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
    """({name: entered}, {name: why refused}), each namespace unshared on its own."""
    entered, refused = {}, {}
    for name in wanted:
        entered[name] = _libc.unshare(ctypes.c_int(_NAMESPACES[name])) == 0
        if not entered[name]:
            refused[name] = os.strerror(ctypes.get_errno())
    return entered, refused


def _bind(fd, target, readonly):
    os.makedirs(target, exist_ok=True)
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    if readonly:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_filesystem(cfg, entered):
    if not entered.get("mount"):
        return
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # our mounts must not propagate to the host
    # handles to what is bound back, taken in the new namespace and before tmpfs hides the paths
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
    # SIGXCPU at the soft limit, SIGKILL a second later in case it is caught
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, key in (("RLIMIT_AS", "address_space_bytes"), ("RLIMIT_NPROC", "max_processes"),
                      ("RLIMIT_FSIZE", "file_size_bytes"), ("RLIMIT_NOFILE", "max_open_files")):
        value = cfg[key]
        resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child(cfg, entered, status_fd):
    """The sandbox's init: finish the isolation as root, then run the solution. Never returns."""
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        stdin_fd = os.open(cfg["stdin_path"], os.O_RDONLY)  # before the work dir moves
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        os.unlink(cfg["stdin_path"])
        _build_filesystem(cfg, entered)
        workdir = cfg["sandbox_dir"] if entered.get("mount") else cfg["workdir"]
        os.chown(workdir, cfg["uid"], cfg["uid"])
        # without a mount namespace, a handle opened as root reaches an interpreter the uid cannot search to
        python_fd = None if entered.get("mount") else os.open(cfg["python_prefix"], os.O_PATH | os.O_DIRECTORY)
    except BaseException as err:  # report why the sandbox could not start, then die without cleanup
        _report(status_fd, setup_error=f"{type(err).__name__}: {err}")
        os._exit(127)
    _init(cfg, status_fd, workdir, python_fd)


def _become(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _exec_solution(cfg, status_fd, workdir, python_fd):
    """In the solution's process: limits, the throwaway uid, then exec. Never returns."""
    try:
        _set_limits(cfg)
        _become(cfg["uid"])
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        # after setuid, which clears the parent-death signal
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        os.chdir(workdir)
        python = cfg["python"]
        # a reachable interpreter runs by its own path, so the solution can start it again
        reachable = os.access(python, os.X_OK) and os.access(cfg["python_prefix"], os.R_OK | os.X_OK)
        if python_fd is not None and not reachable:
            os.set_inheritable(python_fd, True)  # the interpreter finds its stdlib through it too
            python = f"/proc/self/fd/{python_fd}/{cfg['python_relative']}"
        os.execve(python, [python, *cfg["python_flags"], cfg["script"]], {})
    except BaseException as err:  # the status fd is close-on-exec: only a failed exec can get here
        _report(status_fd, exec_error=f"{type(err).__name__}: {err}")
    os._exit(127)


def _init(cfg, status_fd, workdir, python_fd):
    """Stay the init (root; PID 1 ignores default-action signals such as SIGXCPU, so the solution must not
    be it), reap orphans, report the solution's status and usage, then exit, killing what it left."""
    pid = os.fork()
    if pid == 0:
        _exec_solution(cfg, status_fd, workdir, python_fd)
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


def kill_uid(uid):
    """SIGKILL every process of `uid` with one kill(-1) from that uid, which a fork bomb cannot outrun."""
    pid = os.fork()
    if pid == 0:
        try:
            _become(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _remove_files_of(uid, directories, keep):
    """Delete the top-level entries `uid` owns in `directories` (its processes are dead: nothing races)."""
    for directory in directories:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.path == keep or entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def main():
    cfg = json.loads(sys.argv[1])
    if "kill_uid" in cfg:  # the host's fallback when it had to kill this launcher before it cleaned up
        kill_uid(cfg["kill_uid"])
        return 0
    status_fd = cfg["status_fd"]
    os.set_inheritable(status_fd, False)  # the solution must not be able to forge our report
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # host gone -> launcher gone -> sandbox gone
    entered, refused = _enter_namespaces(cfg["namespaces"])
    if refused and cfg["require_isolation"]:
        _report(status_fd, isolation=entered, namespaces_refused=refused)
        return 127
    if not entered.get("pid"):
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans come back here to be killed and reaped
    pid = os.fork()
    if pid == 0:
        _child(cfg, entered, status_fd)
    _report(status_fd, isolation=entered, child_pid=pid)
    os.waitpid(pid, 0)  # the init reports the solution's status itself
    if not entered.get("pid"):
        kill_uid(cfg["uid"])
        with contextlib.suppress(ChildProcessError):  # reap them all
            while True:
                os.waitpid(-1, 0)
    if not entered.get("mount"):
        _remove_files_of(cfg["uid"], cfg["hidden_paths"], keep=cfg["workdir"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
