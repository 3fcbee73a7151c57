"""A process holding a ``wool.WorkerPool`` on ``RedisDiscovery``, for the tests.

``python tests/redis_pool_process.py URL NAMESPACE SPAWN LEASE`` enters
``WorkerPool(spawn=SPAWN, discovery=RedisDiscovery(URL, NAMESPACE,
lease=LEASE))``, prints ``ready`` and waits until its stdin closes (or it is
killed). Its workers import ``e2e_routines`` (``tests/`` is on ``sys.path``,
which ``spawn`` hands down).
"""

from __future__ import annotations

import asyncio
import sys

import wool

from wool_pooling.redis import RedisDiscovery


async def main(url: str, namespace: str, spawn: int, lease: float) -> None:
    discovery = RedisDiscovery(url, namespace, lease=lease)
    async with wool.WorkerPool(spawn=spawn, discovery=discovery):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
