"""The test suite's ``redis-server`` helper under a port race: CI runs two
interpreters' suites side by side, so a port chosen free may be taken before
the server binds it, or a sentinel's."""

from __future__ import annotations

import socket

import pytest
from _redis import RedisServer
from _redis import SentinelSet
from _redis import require_redis_server


def taken_port() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def test_a_first_start_on_a_taken_port_moves_to_a_free_one() -> None:
    server = RedisServer(require_redis_server())
    with taken_port() as stranger:
        server.port = stranger.getsockname()[1]
        try:
            server.start()
            assert server.port != stranger.getsockname()[1]
            with socket.create_connection(("127.0.0.1", server.port), 2) as sock:
                sock.sendall(b"PING\r\n")
                assert sock.recv(64).startswith(b"+PONG")
        finally:
            server.cleanup()


def test_a_restart_keeps_its_port_and_fails_if_it_was_taken() -> None:
    server = RedisServer(require_redis_server())
    try:
        server.start()
        port = server.port
        server.restart()
        assert server.port == port
        server.stop()
        with socket.socket() as stranger:
            stranger.bind(("127.0.0.1", port))
            stranger.listen()
            with pytest.raises(RuntimeError, match="redis-server exited with"):
                server.start()
        assert server.port == port
    finally:
        server.cleanup()


def test_a_sentinel_whose_port_was_taken_starts_on_a_free_one() -> None:
    group = SentinelSet(require_redis_server())
    with taken_port() as stranger:
        group.sentinel_ports[1] = stranger.getsockname()[1]
        try:
            group.start()  # ready: every sentinel sees the replica and the others
            assert stranger.getsockname()[1] not in group.sentinel_ports
            assert len(set(group.sentinel_ports)) == 3
            assert group.current_master() == ("127.0.0.1", group.master.port)
        finally:
            group.cleanup()
