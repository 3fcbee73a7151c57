"""A real ``redis-server`` for the tests: started on a free loopback port.

Persistence is off (``--save "" --appendonly no``), so a restart empties it,
as a crashed cache server would. Without ``redis-server`` on ``PATH`` the
tests that need it skip, saying how to install it, unless
``WOOL_POOLING_REQUIRE_REDIS=1`` (CI sets it) turns the skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

INSTALL_HINT = (
    "redis-server is not on PATH: install it (Debian/Ubuntu: "
    "`apt-get install -y redis-server`; macOS: `brew install redis`) to run the "
    "Redis discovery tests"
)


def require_redis_server() -> str:
    """The path of ``redis-server``; skip (or fail, under
    ``WOOL_POOLING_REQUIRE_REDIS=1``) when there is none."""
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


class RedisServer:
    """One ``redis-server`` process; :meth:`restart` keeps its port."""

    def __init__(self, executable: str, *extra: str) -> None:
        self.executable = executable
        self.extra = extra
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="wool-pooling-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
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
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self.process.returncode}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    reply = sock.recv(64)
                    if reply.startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer within 20 s")
            time.sleep(0.02)

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
