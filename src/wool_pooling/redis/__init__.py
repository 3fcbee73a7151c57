"""``RedisDiscovery``: wool discovery through one Redis server, beyond one machine.

Needs the ``redis`` extra: ``pip install "wool-pooling[redis]"`` (redis-py's
asyncio client). ``RedisDiscovery(url, namespace)`` is a wool ``DiscoveryLike``:

.. code-block:: python

    import wool
    from wool_pooling.redis import RedisDiscovery

    discovery = RedisDiscovery("redis://10.0.0.2:6379/0", "prod", bind_host="0.0.0.0")
    async with wool.WorkerPool(spawn=4, discovery=discovery):
        ...

**Urls.** ``redis://`` and ``rediss://`` (TLS), ``unix:///path/redis.sock``,
and ``redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]``
(a master monitored by Sentinel: a failover is a reconnect like any other;
the user and password reach the sentinels too, unless
``client_options["sentinel_kwargs"]`` gives theirs),
and ``redis+cluster://[user[:password]@]host:port[,host:port...][?options]``
(``rediss+cluster://`` for TLS: see **Cluster** below), checked at
construction. ``client_options`` go to redis-py's client (the
url wins over them, they win over the defaults); ``key_prefix`` replaces
``wool:`` in every key and channel. ``docs/redis.rst`` lists the keys,
channels and commands, and an ACL rule that suffices.

**Records.** A namespace's workers live in one Redis hash (worker uid ->
the metadata's protobuf bytes, ``WorkerMetadata.to_protobuf()``), each
with a lease in a sorted set (expiry on the server's clock). Every change
is one Lua script that updates the hash and the lease, increments the
namespace's version (``INCR``) and announces ``<version> <epoch> <type>
<uid> <bytes>`` on the namespace's channel (named after the database too,
as pub/sub ignores databases), atomically. The epoch is a random token set
again whenever the version counter is found missing (a flush, an eviction,
a restart without persistence): versions compare within one epoch only.

**Ordering.** A subscriber subscribes to the channel first, then reads the
hash and the version in one script (the snapshot), and yields the snapshot
as ``worker-added`` events, then every announcement with a version above
the snapshot's, in version order. Announcements at or below it are already
in the snapshot, or duplicates, and are skipped; a missing version (an
announcement lost), an announcement from another epoch (a flush) and one
that does not parse (warned and counted, never advancing the version) are
handled as a lost connection: a new snapshot. A consumer never
receives a second ``worker-added`` for a worker it has, nor a drop of a
worker it does not have.

**One subscription per process.** Subscribers of the same connection and
namespace in one process share one subscription (``@shared_subscription``,
keyed by the normalised connection: scheme, resolved host, port, database
and user; and by key prefix and namespace; the first subscriber's options
apply, and a later one given other options is warned): one pub/sub
connection named ``wool-pooling:subscriber:<namespace>:<host>:<pid>``
(``CLIENT SETNAME``, so ``CLIENT LIST`` shows who holds it) and one
command connection (``wool-pooling:subscriber-cmd:...``) for snapshots
and reaping, however many proxies subscribe. Consumers joining late are
replayed the known workers by the pool, not by a new snapshot. Filters are
applied per consumer by :class:`~wool_pooling.afilter`. ``shared=False``
gives every iteration its own connections (for comparison).

**Managed services.** ``name_connections=False`` (on the discovery, which
passes it to its publisher, or on a publisher) sends no ``CLIENT`` command
at all: no ``CLIENT SETNAME``, nor redis-py's own ``CLIENT SETINFO`` and
``CLIENT MAINT_NOTIFICATIONS``, for servers that refuse them (Memorystore,
some proxies); ``CLIENT LIST`` then shows no names. With the default, such
a server's refusal is a :class:`RedisDiscoveryError` naming ``CLIENT
SETNAME`` and the option.

**Dead connections.** A pub/sub connection whose peer stops answering
without closing it (a NAT or load balancer that dropped its state, a
stalled server) is a lost connection too, noticed within
``liveness_timeout`` seconds (10 by default) of the last thing read from
it: after ``liveness_timeout / 2`` seconds without an announcement the
subscription sends a ``PING`` on it, and when nothing has answered by
``liveness_timeout`` it reconnects (a reap under way on the command
connection is held to the same deadline). The cost: one ``PING`` per
``liveness_timeout / 2`` seconds on a quiet connection.

**Reconnects.** When a connection is lost (server restart, ``CLIENT
KILL``, a network error, a version gap, a silent peer), the subscription
closes both connections, waits as its ``reconnect``
:class:`~wool_pooling.RestartPolicy` says (exponential backoff with
jitter; unlimited attempts by default;
``settle`` and ``restart_on_end`` do not apply), logging each attempt on
the ``wool_pooling.redis`` logger, subscribes again and takes a new
snapshot. Consumers then receive only the difference between the workers
they had and the snapshot (added, updated, dropped): nothing lost, nothing
repeated. While disconnected, consumers keep their last view. If the
server lost its data meanwhile (a restart without persistence, a flush:
the namespace's epoch key changed), the workers missing from the snapshot
are held for ``lease`` seconds, the time their publishers take to add them
again, and only those not added again by then are dropped: a server
restart does not make every proxy drop every worker. Failing the
first connection raises :class:`RedisDiscoveryError` at once (within
``connect_timeout``), as does a server that refuses the client (wrong
password, ACL, a key holding data that is not the discovery's); later, the
same faults are retried under the policy, and when its attempts run out,
every consumer gets a :class:`RedisDiscoveryError`. Messages and log lines
name the action, the url without its password and the server's reason.

**Leases.** The publisher renews the lease of each worker it published
every ``lease / 3`` seconds while it is entered and the worker's process is
alive; a record lost with the server's data is added again at the next
renewal. A worker whose publisher died, or whose process died, is dropped
(and the drop announced) once its lease has expired: within ``lease +
reap_interval`` seconds of its last renewal, by whichever publisher or
subscriber of the namespace reaps first (each subscribing process reaps
every ``reap_interval`` seconds, ``lease / 4`` by default, and checks the
epoch then). A drop that fails (the server unreachable) still raises, but
the publisher forgets the worker at once and retries the drop until the
server takes it.

**Namespace lifecycle.** No key stays for ever: every script of a
publisher or a subscriber gives the namespace's keys (hash, leases,
version, epoch) one shared expiry, 10 times the larger of its ``lease``
and ``reap_interval`` from now, never shortening a later one. Publishers
run one every ``lease / 3`` and subscribers every ``reap_interval``, so
the keys stay, epoch unchanged, while any of them lives, and expire once
the namespace has had no worker, publisher or subscriber for that long. An
expiry under a live subscriber (a process stalled for ten leases) is the
lost-data case above: a new epoch, and subscribers take a new snapshot.

**Cluster.** A ``redis+cluster://`` url names seed nodes of a Redis
Cluster (7 or later; database 0 only). A namespace's keys and channel share
one hash tag, so one slot: the publisher's scripts run through redis-py's
``RedisCluster`` (following ``MOVED`` and ``ASK``), and announce with
``SPUBLISH`` (sharded pub/sub: to the slot's shard only, where ``PUBLISH``
would reach every node). A subscription reads the layout from the seeds,
then subscribes (``SSUBSCRIBE``) and takes its snapshot on the master
owning the slot, both on that one node. Nothing follows a slot silently: the
unsolicited ``sunsubscribe`` a node sends when the slot migrates away, a
``MOVED`` reply, and a master that dies (until its replica takes over) each
end the session like any lost connection: it reconnects under the
``reconnect`` policy, on the slot's new master, with a new snapshot, and
consumers receive only what changed.

**Invalid records.** A record or announcement that is not valid worker
metadata is skipped with a warning on ``wool_pooling.redis`` and counted
in :meth:`RedisDiscovery.statistics`; it never ends the subscription.

**Statistics.** :meth:`RedisDiscovery.statistics` returns what this
process's subscribers of the connection and namespace have counted
(:class:`RedisStatistics`): connections held (two per subscription,
however many consumers share it), snapshots, announcements, gaps, epoch
changes, reconnects, invalid records and seconds since the last message.
An announcement costs one counter update; see the docs' Metrics page for
exporting them.

**Asyncio only.** redis-py's client, and wool itself, run on asyncio
(uvloop and eager task factories included). Under trio, iterating a
subscriber or entering a publisher raises :exc:`RuntimeError` saying so.
"""

from __future__ import annotations

try:
    import redis.asyncio  # pyright: ignore[reportUnusedImport]  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        'wool_pooling.redis needs redis-py: pip install "wool-pooling[redis]"'
    ) from error

from ._connection import redact
from ._discovery import RedisDiscovery
from ._errors import DEFAULT_RECONNECT
from ._errors import RedisDiscoveryError
from ._publisher import RedisPublisher
from ._statistics import RedisStatistics

__all__ = [
    "DEFAULT_RECONNECT",
    "RedisDiscovery",
    "RedisDiscoveryError",
    "RedisPublisher",
    "RedisStatistics",
    "redact",
]
