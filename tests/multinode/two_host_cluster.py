"""A two-host Ray cluster on one machine: two network namespaces joined by a veth pair, a Ray head node in one and a
worker node in the other, the driver in the head's namespace.

Each namespace is a host as far as the network goes: its own interfaces, addresses, ports and loopback; the hosts
share the filesystem, which stands in for the shared checkpoint storage of a real cluster. Every address is one this
module assigns inside the namespaces it creates; nothing touches the machine's own network. Each host also gets a
local interface (`UNROUTED_INTERFACE`) whose address the other host has no route to, for the tests of ranks that
cannot reach each other.

`RAY_HEAD` and `RAY_WORKER` are the commands docs/multinode.md gives for real machines (a test checks they agree);
`SANDBOX_FLAGS` are what the tests add so that two nodes on one machine keep apart and stay small.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY_PORT = 6379
RAY_HEAD = "ray start --head --node-ip-address={head_ip} --port={port} --num-cpus={cpus}"
RAY_WORKER = "ray start --address={head_ip}:{port} --node-ip-address={host_ip} --num-cpus={cpus}"
SANDBOX_FLAGS = "--temp-dir={temp_dir} --object-store-memory=200000000 --disable-usage-stats"
SANDBOX_HEAD_FLAGS = "--include-dashboard=false"
# The head marks a silent node dead after 3 failed health checks 1 s apart, each waiting up to 3 s (Ray's default:
# 5 checks 3 s apart, each waiting up to 10 s), so that a lost host's replacement joins sooner and a host cut off
# from the network is declared dead in about 12 s; a killed host's ranks are reported as soon as their connections
# close.
SANDBOX_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "3000",
               "RAY_health_check_failure_threshold": "3"}
UNROUTED_INTERFACE = "hyunrouted"
SUBNET = "10.213.0"  # the veth pair's /24, inside the namespaces only
UNROUTED_SUBNET = "10.214"  # one /32 per host on its unrouted interface: no route between them


def namespaces_unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no `ip`), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"hyprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=True)
    return None


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


@dataclass
class Host:
    name: str  # "head" or "worker"
    namespace: str
    ip: str
    unrouted_ip: str
    temp_dir: Path

    def command(self, *argv: str) -> list[str]:
        """argv run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def pids(self) -> list[int]:
        listed = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True)
        return [int(pid) for pid in listed.stdout.split()]

    def kill_all(self) -> None:
        """SIGKILL every process in the namespace: the host's power cut, as far as its processes go (the other host
        sees their sockets close)."""
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        raise RuntimeError(f"processes of namespace {self.namespace} survive SIGKILL: {self.pids()}")


@dataclass
class TwoHostCluster:
    """The two hosts, their Ray nodes and the environment of a driver on the head host."""

    root: Path
    cpus_per_host: int = 2
    tag: str = field(default_factory=lambda: str(os.getpid()))
    hosts: list[Host] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Ray's unix sockets live under its temp dir, and their paths must stay under 108 bytes
        self.ray_root = Path(tempfile.mkdtemp(prefix="hyray", dir="/tmp"))
        self.hosts = [Host(name, f"hy{name[0]}{self.tag}", f"{SUBNET}.{i + 1}", f"{UNROUTED_SUBNET}.{i}.1",
                           self.ray_root / name[0]) for i, name in enumerate(("head", "worker"))]
        self.veth = (f"hyv{self.tag}a", f"hyv{self.tag}b")

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def worker(self) -> Host:
        return self.hosts[1]

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{RAY_PORT}"

    def ray_command(self, host: Host) -> list[str]:
        template = RAY_HEAD if host is self.head else RAY_WORKER
        documented = template.format(head_ip=self.head.ip, port=RAY_PORT, host_ip=host.ip, cpus=self.cpus_per_host)
        argv = [*documented.split(), *SANDBOX_FLAGS.format(temp_dir=host.temp_dir).split(),
                *(SANDBOX_HEAD_FLAGS.split() if host is self.head else [])]
        return [str(Path(sys.executable).with_name("ray")), *argv[1:]]

    def driver_env(self) -> dict[str, str]:
        """The test process's environment less its socket-interface choices (names of its own interfaces, which
        the hosts lack), with the cluster's address."""
        inherited = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
        return {**inherited, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "disabled", **SANDBOX_ENV}

    # ----- life --------------------------------------------------------------------------------------------
    def create(self) -> None:
        """The namespaces, the veth pair between them and each host's unrouted interface."""
        a, b = self.veth
        for host in self.hosts:
            _run("ip", "netns", "add", host.namespace)
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for host, end in zip(self.hosts, self.veth, strict=True):
            _run("ip", "link", "set", end, "netns", host.namespace)
            _run("ip", "-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", end)
            _run("ip", "-n", host.namespace, "link", "set", end, "up")
            _run("ip", "-n", host.namespace, "link", "set", "lo", "up")
            # a veth pair with both ends on the host: a kernel without the dummy module has it too
            _run("ip", "-n", host.namespace, "link", "add", UNROUTED_INTERFACE, "type", "veth", "peer", "name",
                 f"{UNROUTED_INTERFACE}p")
            _run("ip", "-n", host.namespace, "addr", "add", f"{host.unrouted_ip}/32", "dev", UNROUTED_INTERFACE)
            _run("ip", "-n", host.namespace, "link", "set", UNROUTED_INTERFACE, "up")
            _run("ip", "-n", host.namespace, "link", "set", f"{UNROUTED_INTERFACE}p", "up")

    def start_node(self, host: Host) -> None:
        host.temp_dir.mkdir(parents=True, exist_ok=True)
        started = subprocess.run(host.command(*self.ray_command(host)), capture_output=True, text=True,
                                 env=self.driver_env(), timeout=120)
        if started.returncode != 0:
            raise RuntimeError(f"ray start on the {host.name} host failed:\n{started.stdout}\n{started.stderr}")

    def start(self) -> None:
        self.create()
        for host in self.hosts:
            self.start_node(host)
        self.wait_alive(2)

    def alive_nodes(self) -> list[str]:
        """The addresses of the nodes the head reports alive."""
        code = (f"import ray; ray.init(address={self.address!r}, logging_level='ERROR'); "
                "print(' '.join(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))")
        out = subprocess.run(self.head.command(sys.executable, "-c", code),
                             capture_output=True, text=True, env=self.driver_env(), timeout=120)
        return out.stdout.split()

    def wait_alive(self, count: int, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(alive := self.alive_nodes()) != count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster has {alive} alive, not {count} nodes, after {timeout_s:.0f} s")
            time.sleep(1)

    def lose_worker_host(self) -> None:
        """Every process of the worker host dies at once (its raylet, its Ray workers, the ranks on it)."""
        self.worker.kill_all()

    def cut_worker_host_off(self) -> None:
        """The worker host's link goes down: its processes keep running, but nothing reaches them or comes back
        (no connection is closed, so nobody learns of it but by silence)."""
        _run("ip", "-n", self.worker.namespace, "link", "set", self.veth[1], "down")

    def reconnect_worker_host(self) -> None:
        """A host cut off comes back as a fresh node: its old processes killed, its link up, its node restarted."""
        self.worker.kill_all()
        _run("ip", "-n", self.worker.namespace, "link", "set", self.veth[1], "up")
        self.restart_worker_host()

    def restart_worker_host(self) -> None:
        """A fresh worker node joins, once the head has marked the lost one dead (its health checks failed)."""
        self.wait_alive(1)
        self.start_node(self.worker)
        self.wait_alive(2)

    def destroy(self) -> None:
        """Kill every process of both hosts and delete the namespaces (which deletes their interfaces)."""
        for host in self.hosts:
            if host.namespace in self.namespaces():
                host.kill_all()
                subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
        shutil.rmtree(self.ray_root, ignore_errors=True)

    def namespaces(self) -> list[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in listed.splitlines() if line.strip()]

    def leftovers(self) -> list[str]:
        """What the cluster left behind: its namespaces, its veth ends in the root namespace, its processes, its
        Ray temp dir."""
        left = [f"namespace {ns}" for ns in self.namespaces() if ns in {h.namespace for h in self.hosts}]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        left += [f"link {end}" for end in self.veth if f" {end}@" in links or f" {end}:" in links]
        stray = subprocess.run(["pgrep", "-f", str(self.ray_root)], capture_output=True, text=True).stdout.split()
        left += [f"process {pid}" for pid in stray]
        return left + ([f"directory {self.ray_root}"] if self.ray_root.exists() else [])
