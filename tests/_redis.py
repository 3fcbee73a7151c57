"""A real ``redis-server`` for the tests: started on a free loopback port.

Persistence is off (``--save "" --appendonly no``), so a restart empties it,
as a crashed cache server would. Without ``redis-server`` on ``PATH`` the
tests that need it skip, saying how to install it, unless
``WOOL_POOLING_REQUIRE_REDIS=1`` (CI sets it) turns the skip into a failure.

``WOOL_POOLING_REDIS_SERVER`` chooses another server: a path (or a name on
``PATH``) of an executable that takes ``redis-server``'s arguments, such as
``valkey-server``, another version's ``redis-server``, or a wrapper script
that execs one (``.ci/servers`` writes such wrappers). Sentinels run
as ``<it> <config> --sentinel``. A variable naming nothing executable fails
the tests (never a skip: the server was asked for).
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

INSTALL_HINT = (
    "redis-server is not on PATH: install it (Debian/Ubuntu: "
    "`apt-get install -y redis-server`; macOS: `brew install redis`) to run the "
    "Redis discovery tests"
)


#: The environment variable that chooses the server binary (see above).
SERVER_VARIABLE = "WOOL_POOLING_REDIS_SERVER"


def require_redis_server() -> str:
    """The path of the server binary: ``$WOOL_POOLING_REDIS_SERVER`` if set
    (failing if it is not executable), else ``redis-server`` on ``PATH``;
    skip (or fail, under ``WOOL_POOLING_REQUIRE_REDIS=1``) when there is
    none."""
    chosen = os.environ.get(SERVER_VARIABLE, "")
    if chosen:
        path = shutil.which(chosen)
        if path is None:
            pytest.fail(
                f"{SERVER_VARIABLE}={chosen!r} names no executable (a path, or "
                "a name on PATH, of a redis-server compatible server)"
            )
    else:
        path = shutil.which("redis-server")
    if path is None:
        if os.environ.get("WOOL_POOLING_REQUIRE_REDIS") == "1":
            pytest.fail(f"WOOL_POOLING_REQUIRE_REDIS=1 but {INSTALL_HINT}")
        pytest.skip(INSTALL_HINT)
    try:
        import redis  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        if os.environ.get("WOOL_POOLING_REQUIRE_REDIS") == "1":
            pytest.fail(
                "WOOL_POOLING_REQUIRE_REDIS=1 but redis-py is missing: "
                'pip install -e ".[redis]"'
            )
        pytest.skip('redis-py is missing: pip install -e ".[redis]"')
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers_or_exits(
    process: subprocess.Popen[bytes], name: str, connect: Callable[[], socket.socket]
) -> int | None:
    """``None`` once ``process`` answers a PING on what ``connect`` opens and is
    still alive (so the answer is its own), its exit code if it exits first.
    It is killed if it does neither within 20 s."""
    deadline = time.monotonic() + 20
    while True:
        exited = process.poll()
        if exited is not None:
            return exited
        try:
            with connect() as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
                if reply.startswith((b"+PONG", b"-NOAUTH")) and process.poll() is None:
                    return None
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(f"{name} did not answer within 20 s")
        time.sleep(0.02)


class RedisServer:
    """One ``redis-server`` process; :meth:`restart` keeps its port."""

    def __init__(self, executable: str, *extra: str) -> None:
        self.executable = executable
        self.extra = extra
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="wool-pooling-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.started_once = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def socket_path(self) -> Path:
        """The server's unix socket (it listens on both)."""
        return self.directory / "redis.sock"

    def start(self) -> None:
        """Start the server and wait until it answers on its own unix socket
        (never a stranger's port). At the first start, a port another process
        took since :func:`free_port` chose it is replaced by a fresh one (CI
        runs two interpreters' suites side by side); a later start keeps it.
        """
        exited: int | None = None
        for _ in range(5):
            exited = self._start_once()
            if exited is None:
                self.started_once = True
                return
            if self.started_once:
                break
            self.port = free_port()
        raise RuntimeError(f"redis-server exited with {exited}")

    def _start_once(self) -> int | None:
        """``None`` once the server answers, its exit code if it exits first."""
        self.process = subprocess.Popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--unixsocket",
                str(self.socket_path),
                "--unixsocketperm",
                "700",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        exited = _answers_or_exits(self.process, "redis-server", self._connect)
        if exited is not None:
            self.process = None
        return exited

    def _connect(self) -> socket.socket:
        """A connection to the server's own unix socket, never a stranger's port."""
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.settimeout(0.2)
            sock.connect(str(self.socket_path))
        except OSError:
            sock.close()
            raise
        return sock

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def restart(self) -> None:
        """Stop and start again on the same port (the data is gone)."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def _sentinel_answers(
    port: int, service: str, password: str | None = None
) -> tuple[str, int] | None:
    """The master a sentinel reports, if it answers."""
    import redis

    client = redis.Redis(
        port=port, password=password, socket_timeout=1, decode_responses=True
    )
    try:
        address = client.sentinel_get_master_addr_by_name(service)
        return None if address is None else (str(address[0]), int(address[1]))
    except redis.RedisError:
        return None
    finally:
        client.close()


class SentinelSet:
    """A master, one replica and three sentinels (``redis-server --sentinel``)
    on loopback, tuned to fail over within a few seconds (a master is down after 1 s
    without answering: short, yet no false failover on a loaded machine).

    With a ``password``, every one of them requires it (``requirepass``), and
    the replica and the sentinels give it to the master (``masterauth``,
    ``sentinel auth-pass``): the usual hardening. ``open_sentinels=True``
    leaves the sentinels without one (the data nodes still require it)."""

    SERVICE = "wool-master"

    def __init__(
        self,
        executable: str,
        *,
        password: str | None = None,
        open_sentinels: bool = False,
    ) -> None:
        self.executable = executable
        self.password = password
        #: What the sentinels require, if anything.
        self.sentinel_password = None if open_sentinels else password
        auth = (
            ()
            if password is None
            else ("--requirepass", password, "--masterauth", password)
        )
        self.master = RedisServer(executable, *auth)
        self.replica = RedisServer(executable, *auth)
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.directory = Path(tempfile.mkdtemp(prefix="wool-pooling-sentinel-"))
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.SERVICE}/0"

    def start(self) -> None:
        self.master.start()
        self.replica.extra = (
            *self.replica.extra,
            "--replicaof",
            "127.0.0.1",
            str(self.master.port),
        )
        self.replica.start()
        for index in range(len(self.sentinel_ports)):
            self._start_sentinel(index)
        self.wait_until_ready()

    def _start_sentinel(self, index: int) -> None:
        """Start sentinel ``index`` and wait until it answers. A port taken
        since :func:`free_port` chose it (the replica's own connection to the
        master may take it) makes the sentinel exit: it is started again on
        a fresh one, as :meth:`RedisServer.start` does."""
        exited: int | None = None
        for _ in range(5):
            port = self.sentinel_ports[index]
            config = self.directory / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\n"
                "bind 127.0.0.1\n"
                f"dir {self.directory}\n"
                f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.SERVICE} 1000\n"
                f"sentinel failover-timeout {self.SERVICE} 2000\n"
                f"sentinel parallel-syncs {self.SERVICE} 1\n"
            )
            if self.password is not None:
                with config.open("a") as file:
                    file.write(f"sentinel auth-pass {self.SERVICE} {self.password}\n")
                    if self.sentinel_password is not None:
                        file.write(f"requirepass {self.sentinel_password}\n")
            process = subprocess.Popen(
                [self.executable, str(config), "--sentinel"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            exited = _answers_or_exits(
                process,
                "a sentinel",
                functools.partial(
                    socket.create_connection, ("127.0.0.1", port), timeout=0.2
                ),
            )
            if exited is None:
                if index < len(self.sentinels):
                    self.sentinels[index] = process
                else:
                    self.sentinels.append(process)
                return
            self.sentinel_ports[index] = free_port()
        raise RuntimeError(f"a sentinel exited with {exited}")

    def wait_until_ready(self) -> None:
        """Until every sentinel knows the master, the replica and the other
        two sentinels (what a failover needs). On a timeout the error says
        what each sentinel saw last."""
        import redis

        deadline = time.monotonic() + 30
        while True:
            seen: dict[int, str] = {}
            ports = list(self.sentinel_ports)
            for index, (port, process) in enumerate(
                zip(ports, self.sentinels, strict=True)
            ):
                if process.poll() is not None:
                    # Another process of a parallel run held its port, and
                    # answered for it: started again on a fresh one.
                    seen[port] = f"exited with {process.returncode}"
                    self.sentinel_ports[index] = free_port()
                    self._start_sentinel(index)
                    continue
                client = redis.Redis(
                    port=port, password=self.sentinel_password, socket_timeout=1
                )
                try:
                    replicas = client.sentinel_slaves(self.SERVICE)
                    others = client.sentinel_sentinels(self.SERVICE)
                    ports = sorted(int(r["port"]) for r in replicas)
                    if self.replica.port in ports and len(others) == 2:
                        continue
                    seen[port] = f"replicas at {ports}, {len(others)} other sentinels"
                except redis.RedisError as error:
                    seen[port] = f"{type(error).__name__}: {error}"
                finally:
                    client.close()
            if not seen:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "the sentinels did not see each other within 30 s (replica "
                    f"at {self.replica.port}): "
                    + "; ".join(f"{port}: {what}" for port, what in seen.items())
                )
            time.sleep(0.05)

    def current_master(self) -> tuple[str, int] | None:
        for port in self.sentinel_ports:
            address = _sentinel_answers(port, self.SERVICE, self.sentinel_password)
            if address is not None:
                return address
        return None

    def kill_master(self) -> None:
        """SIGKILL the master: the sentinels promote the replica."""
        process = self.master.process
        assert process is not None
        process.kill()
        process.wait()
        self.master.process = None

    def cleanup(self) -> None:
        for process in self.sentinels:
            process.terminate()
        for process in self.sentinels:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.sentinels.clear()
        self.replica.cleanup()
        self.master.cleanup()
        shutil.rmtree(self.directory, ignore_errors=True)
