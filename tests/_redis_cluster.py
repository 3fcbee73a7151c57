"""A real Redis Cluster for the tests: 3 masters and 3 replicas on loopback.

Each node is a ``redis-server --cluster-enabled yes`` in its own temporary
directory, persistence off; ``redis-cli --cluster create`` joins them. A
short ``cluster-node-timeout`` makes a replica take over within seconds of
its master's death. :meth:`RedisCluster.cleanup` kills every process it
started and removes every directory.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _redis import require_redis_server

#: Milliseconds without an answer before a node is deemed failed.
NODE_TIMEOUT_MS = 1000

#: The loopback test certificate (``tests/tls``), its own CA.
CERTIFICATE = Path(__file__).resolve().parent / "tls" / "server.crt"
KEY = CERTIFICATE.with_name("server.key")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` ports, each free along with its cluster bus port (+10000)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(20000, 30000)
        if port not in ports and _bindable(port) and _bindable(port + 10000):
            ports.append(port)
    return ports


def _wait(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


class ClusterNode:
    """One ``redis-server`` of the cluster."""

    def __init__(self, executable: str, port: int, *, tls: bool = False) -> None:
        self.port = port
        self.tls = tls
        self.directory = Path(tempfile.mkdtemp(prefix="wool-pooling-cluster-"))
        listen = ["--port", str(port)]
        if tls:
            listen = [
                "--port",
                "0",
                "--tls-port",
                str(port),
                "--tls-cert-file",
                str(CERTIFICATE),
                "--tls-key-file",
                str(KEY),
                "--tls-ca-cert-file",
                str(CERTIFICATE),
                "--tls-auth-clients",
                "no",
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
            ]
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [
                executable,
                *listen,
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.directory / "nodes.conf"),
                "--cluster-node-timeout",
                str(NODE_TIMEOUT_MS),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self, *args: str | int) -> str:
        """Run a command on this node (``redis-cli``), its reply as text."""
        result = subprocess.run(
            [
                *redis_cli(tls=self.tls),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                *map(str, args),
            ],
            capture_output=True,
            timeout=20,
            check=True,
        )
        reply = result.stdout.decode()
        if reply.startswith(("ERR", "MOVED", "ASK", "CLUSTERDOWN", "(error)")):
            raise RuntimeError(f"{' '.join(map(str, args))} on {self.port}: {reply}")
        return reply

    def answers(self) -> bool:
        try:
            return self.command("PING").strip() == "PONG"
        except subprocess.SubprocessError:
            return False

    def kill(self) -> None:
        """SIGKILL: the node dies at once, its connections reset."""
        process, self.process = self.process, None
        if process is not None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def redis_cli(*, tls: bool) -> list[str]:
    """``redis-cli``, over TLS (trusting the test certificate) if ``tls``."""
    return (
        ["redis-cli", "--tls", "--cacert", str(CERTIFICATE)] if tls else ["redis-cli"]
    )


class RedisCluster:
    """Six nodes (3 masters, 3 replicas), created and checked healthy; over
    TLS only (clients, the cluster bus and replication) if ``tls``."""

    def __init__(self, *, tls: bool = False) -> None:
        self.tls = tls
        executable = require_redis_server()
        if shutil.which("redis-cli") is None:
            pytest.skip("redis-cli is not on PATH (it creates the test cluster)")
        self.nodes = [ClusterNode(executable, port, tls=tls) for port in _free_ports(6)]
        try:
            for node in self.nodes:
                _wait(f"node {node.port} to answer", node.answers)
            subprocess.run(
                [
                    *redis_cli(tls=tls),
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{node.port}" for node in self.nodes),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                capture_output=True,
                timeout=60,
                check=True,
            )
            self.wait_healthy()
        except BaseException:
            self.cleanup()
            raise

    def url(self, seeds: int = 3) -> str:
        """A ``redis+cluster://`` url naming the first ``seeds`` nodes."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes[:seeds])
        return f"{'rediss' if self.tls else 'redis'}+cluster://{hosts}"

    def node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    def live(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.alive]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok`` and agrees on who
        masters each slot."""

        def healthy() -> bool:
            try:
                layouts = {
                    tuple(sorted(self.masters_by_slot_range(node)))
                    for node in self.live()
                }
                return len(layouts) == 1 and all(
                    "cluster_state:ok" in node.command("CLUSTER", "INFO")
                    for node in self.live()
                )
            except subprocess.SubprocessError:
                return False

        _wait("the cluster to be healthy", healthy, timeout)

    def masters_by_slot_range(self, node: ClusterNode) -> list[tuple[int, int, int]]:
        """(first slot, last slot, master port) as ``node`` sees them."""
        ranges: list[tuple[int, int, int]] = []
        for line in node.command("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for part in fields[8:]:
                if part.startswith("["):
                    continue  # a slot being migrated or imported
                first, _, last = part.partition("-")
                ranges.append((int(first), int(last or first), port))
        return ranges

    def node_id(self, node: ClusterNode) -> str:
        return node.command("CLUSTER", "MYID").strip()

    def slot_of(self, key: str) -> int:
        return int(self.live()[0].command("CLUSTER", "KEYSLOT", key))

    def owner(self, slot: int) -> ClusterNode:
        """The master serving ``slot``, as a live node sees it."""
        for first, last, port in self.masters_by_slot_range(self.live()[0]):
            if first <= slot <= last:
                return self.node(port)
        raise LookupError(f"no master serves slot {slot}")

    def replicated(self, master: ClusterNode) -> bool:
        """Whether every replica of ``master`` has acknowledged all its writes."""
        info = master.command("INFO", "replication")
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        offset = fields["master_repl_offset"].strip()
        replicas = [value for name, value in fields.items() if name.startswith("slave")]
        replicas = [value for value in replicas if "offset=" in value]
        return bool(replicas) and all(
            f"offset={offset}," in value for value in replicas
        )

    def wait_promoted(
        self, slot: int, dead: ClusterNode, timeout: float = 30.0
    ) -> ClusterNode:
        """Until one live master other than ``dead`` serves ``slot``, seen
        alike by every live node twice in a row; that master."""
        seen: list[int] = []

        def promoted() -> bool:
            try:
                owners = {
                    port
                    for node in self.live()
                    for first, last, port in self.masters_by_slot_range(node)
                    if first <= slot <= last
                }
            except subprocess.SubprocessError:
                return False
            seen.append(owners.pop() if len(owners) == 1 else dead.port)
            return seen[-1] != dead.port and seen[-2:] == [seen[-1]] * 2

        _wait(f"a replica to take slot {slot} over", promoted, timeout)
        return self.node(seen[-1])

    def migrate_slot(self, slot: int, target: ClusterNode) -> None:
        """Move ``slot`` and its keys to ``target``, as ``redis-cli --cluster
        reshard`` does: :meth:`move_keys`, then :meth:`assign`."""
        source = self.owner(slot)
        self.move_keys(slot, source, target)
        self.assign(slot, source, target)

    def move_keys(self, slot: int, source: ClusterNode, target: ClusterNode) -> None:
        """Mark ``slot`` IMPORTING on ``target`` and MIGRATING on ``source``,
        and MIGRATE its keys: the source still owns the slot, and answers
        ``ASK`` for the keys it no longer has."""
        source_id, target_id = self.node_id(source), self.node_id(target)
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while True:
            keys = source.command("CLUSTER", "GETKEYSINSLOT", slot, 100).split()
            if not keys:
                break
            source.command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
            )

    def assign(self, slot: int, source: ClusterNode, target: ClusterNode) -> None:
        """``CLUSTER SETSLOT <slot> NODE <target>`` on the target, the source
        and every other master; until the cluster agrees."""
        target_id = self.node_id(target)
        others = [node for node in self.masters() if node not in (target, source)]
        for node in [target, source, *others]:
            node.command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.wait_healthy()

    def masters(self) -> list[ClusterNode]:
        ports = {port for _, _, port in self.masters_by_slot_range(self.live()[0])}
        return [self.node(port) for port in sorted(ports)]

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
