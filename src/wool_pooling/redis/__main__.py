"""List a wool-pooling Redis namespace: its version and epoch, its live
subscribers (connections subscribed to its announcements), its workers (uid,
address, pid, version) with how long ago each lease was renewed and how long
it has left; with --watch, follow its events through a RedisDiscovery.

Exit status: 2 for a usage error or a bad url, 1 when the server cannot be
reached or refuses (a wrong password, an ACL), each with one line on stderr.
See docs/command.rst.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import signal
import sys
from typing import Any

import anyio

from ._connection import open_client
from ._connection import parse_url
from ._discovery import RedisDiscovery
from ._errors import FAILURES
from ._errors import RedisDiscoveryError
from ._errors import failed
from ._scripts import DEFAULT_KEY_PREFIX
from ._scripts import Keys
from ._settings import check_seconds
from ._state import decode

#: One atomic read on the node holding the namespace (whose clock set the
#: leases): records, leases, version, epoch, and its time in ms.
_READ = """
local t = redis.call('TIME')
return {redis.call('HGETALL', KEYS[1]),
  redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '+inf', 'WITHSCORES'),
  redis.call('GET', KEYS[3]), redis.call('GET', KEYS[4]),
  tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
"""

_PROG = "python -m wool_pooling.redis"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=_PROG, description=__doc__)
    parser.add_argument(
        "url",
        help="as RedisDiscovery takes: redis://, rediss://, "
        "unix://, redis+sentinel://, redis+cluster://, with [user:password@]",
    )
    parser.add_argument("namespace", help="the namespace, as RedisDiscovery takes")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="print '<event> <uid> <address> <pid> <version>' for the workers "
        "known, then for each change, until Ctrl-C (exit 0)",
    )
    for option, default, help in (
        ("--timeout", 3.0, "bound on connecting and on each command"),
        ("--lease", 10.0, "the publishers' lease, to tell a lease's age"),
    ):
        parser.add_argument(
            option,
            type=float,
            default=default,
            metavar="SECONDS",
            help=f"{help} (default: %(default)s)",
        )
    parser.add_argument(
        "--key-prefix", default=DEFAULT_KEY_PREFIX, help="(default: %(default)s)"
    )
    parser.add_argument(
        "-o",
        "--client-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a redis-py client option (a Python literal, else a string), such "
        "as ssl_ca_certs=/path/ca.pem; repeatable",
    )
    return parser


def _option(text: str) -> tuple[str, Any]:
    name, equals, value = text.partition("=")
    if not equals:
        raise ValueError(f"a client option is NAME=VALUE, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    return ["  ".join(map(str.ljust, row, widths)).rstrip() for row in rows]


async def _listing(discovery: RedisDiscovery, lease: float) -> list[str]:
    """The namespace's lines: version, epoch, subscribers, workers.

    :raises RedisDiscoveryError: if the server cannot be reached or refuses.
    """
    target = parse_url(discovery.url)
    keys = Keys.of(discovery.namespace, target.db, discovery.key_prefix)
    # The discovery's arguments: name_connections=False, no CLIENT command.
    connection = open_client(target, "operator", discovery, retries=0)
    try:
        client = connection.client
        read = client.register_script(_READ)
        records, leases, version, epoch, now = await read(keys=keys.keys, args=[])
        if target.cluster:  # sharded pub/sub, on the node owning the channel
            node = client.get_node_from_key(keys.channel)
            count = await client.pubsub_shardnumsub(keys.channel, target_nodes=node)
        else:
            count = await client.pubsub_numsub(keys.channel)
    except FAILURES as error:
        raise failed(discovery.url, f"listing {discovery.namespace}", error) from error
    finally:
        await connection.aclose()
    expiries = dict(zip(leases[::2], leases[1::2], strict=True))
    rows: list[tuple[str, ...]] = []
    for uid, payload in zip(records[::2], records[1::2], strict=True):
        left = (float(expiries.get(uid, now)) - now) / 1000
        try:
            worker = decode(uid, payload)
            cells = (worker.address, str(worker.pid), worker.version)
        except Exception:
            cells = ("(not a worker's record)", "-", "-")
        age = f"{lease - left:.1f}s" if left <= lease else "?"
        rows.append((uid.decode(), *cells, age, f"{left:.1f}s" if left > 0 else "-"))
    rows.sort(key=lambda row: (row[1], row[0]))
    header = ("UID", "ADDRESS", "PID", "VERSION", "LEASE-AGE", "EXPIRES-IN")
    return [
        f"namespace    {discovery.namespace}",
        f"version      {int(version or 0)}",
        f"epoch        {epoch.decode() if epoch else '-'}",
        f"subscribers  {int(count[0][1])}",
        f"workers      {len(rows)}",
        *_aligned([header, *rows]),
    ]


async def _watch(discovery: RedisDiscovery) -> None:
    """Print one line per event of the namespace's shared subscription, until
    SIGINT or SIGTERM: they cancel a scope, which (unlike one cancellation of
    the main task) goes on cancelling until the iteration has ended."""
    with anyio.CancelScope() as scope:
        for number in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(number, scope.cancel)
        async for event in discovery.subscriber:
            worker = event.metadata
            line = f"{worker.uid} {worker.address} {worker.pid} {worker.version}"
            print(event.type, line, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (default: ``sys.argv[1:]``); its exit status."""
    args = _parser().parse_args(argv)
    try:
        check_seconds("--timeout", args.timeout)
        check_seconds("--lease", args.lease)
        discovery = RedisDiscovery(
            args.url,
            args.namespace,
            connect_timeout=args.timeout,
            client_options=dict(map(_option, args.client_option)),
            key_prefix=args.key_prefix,
            name_connections=False,
        )
    except (TypeError, ValueError) as error:
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        return 2
    try:
        if args.watch:
            asyncio.run(_watch(discovery))
        else:
            print("\n".join(asyncio.run(_listing(discovery, args.lease))))
    except KeyboardInterrupt:
        return 0 if args.watch else 130
    except BrokenPipeError:  # the reader left (``| head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except RedisDiscoveryError as error:
        print(f"{_PROG}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
