"""The Lua scripts and key layout of :class:`~wool_pooling.redis.RedisDiscovery`.

Every change to a namespace's records runs as one Lua script, so the hash,
the leases, the version counter and the announcement on the channel change
together (Redis runs a script atomically): a subscriber that reads the hash
and the version in one script, after subscribing, knows exactly which
announcements its snapshot already contains (those with a version up to the
snapshot's).

Key layout for namespace ``ns`` (the braces are a cluster hash tag, so the
keys of a namespace share a slot):

- ``wool:{ns}:workers``: hash, worker uid -> the metadata's protobuf bytes
- ``wool:{ns}:leases``: sorted set, worker uid -> lease expiry (ms, server clock)
- ``wool:{ns}:version``: counter, incremented once per announcement
- ``wool:{ns}:epoch``: set by the first snapshot; a snapshot that finds a
  different (or no) epoch than the last knows the server lost its data
- channel ``wool:{ns}:events``: ``b"<version> <type> <uid> " + protobuf bytes``

Leases are read against the server's clock (``TIME``), never a client's.
"""

from __future__ import annotations

import attrs

__all__ = ["PUBLISH", "REAP", "RENEW", "SNAPSHOT", "Keys"]


@attrs.frozen
class Keys:
    """The keys and channel of one namespace."""

    workers: str
    leases: str
    version: str
    epoch: str
    channel: str

    @classmethod
    def of(cls, namespace: str) -> Keys:
        prefix = f"wool:{{{namespace}}}"
        return cls(
            workers=f"{prefix}:workers",
            leases=f"{prefix}:leases",
            version=f"{prefix}:version",
            epoch=f"{prefix}:epoch",
            channel=f"{prefix}:events",
        )

    @property
    def keys(self) -> list[str]:
        return [self.workers, self.leases, self.version]

    @property
    def snapshot_keys(self) -> list[str]:
        return [self.workers, self.leases, self.version, self.epoch]


# KEYS: workers, leases, version. Shared prelude: the server's clock in ms, and
# announce(type, uid, payload), which bumps the version and publishes.
_PRELUDE = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function announce(channel, kind, uid, payload)
  local version = redis.call('INCR', KEYS[3])
  redis.call('PUBLISH', channel, version .. ' ' .. kind .. ' ' .. uid .. ' ' .. payload)
  return version
end
local function reap(channel)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, uid in ipairs(expired) do
    redis.call('ZREM', KEYS[2], uid)
    local old = redis.call('HGET', KEYS[1], uid)
    if old then
      redis.call('HDEL', KEYS[1], uid)
      announce(channel, 'worker-dropped', uid, old)
    end
  end
  return #expired
end
"""

#: ARGV: channel, type, uid, payload, lease (ms). Returns the announcement's
#: version, or 0 when nothing changed (a drop of an unknown worker, a re-add
#: with the same metadata, which only renews the lease).
PUBLISH = (
    _PRELUDE
    + """
local channel, kind, uid, payload = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local old = redis.call('HGET', KEYS[1], uid)
if kind == 'worker-dropped' then
  redis.call('ZREM', KEYS[2], uid)
  if not old then return 0 end
  redis.call('HDEL', KEYS[1], uid)
  return announce(channel, 'worker-dropped', uid, old)
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), uid)
if old == payload then return 0 end
redis.call('HSET', KEYS[1], uid, payload)
if old then
  return announce(channel, 'worker-updated', uid, payload)
end
return announce(channel, 'worker-added', uid, payload)
"""
)

#: ARGV: channel, lease (ms), then uid, payload pairs. Renews each lease; a
#: record that is gone (expired, or lost with the server's data) is added
#: again. Then reaps. Returns how many records were added again.
RENEW = (
    _PRELUDE
    + """
local channel, lease = ARGV[1], tonumber(ARGV[2])
local readded = 0
for i = 3, #ARGV, 2 do
  local uid, payload = ARGV[i], ARGV[i + 1]
  redis.call('ZADD', KEYS[2], now + lease, uid)
  if redis.call('HSETNX', KEYS[1], uid, payload) == 1 then
    announce(channel, 'worker-added', uid, payload)
    readded = readded + 1
  end
end
reap(channel)
return readded
"""
)

#: ARGV: channel. Drops the records whose lease has expired (announcing each
#: drop). Returns how many leases had expired.
REAP = (
    _PRELUDE
    + """
return reap(ARGV[1])
"""
)

#: KEYS: workers, leases, version, epoch. ARGV: channel, a new epoch (set if
#: there is none). Reaps, then returns {version, epoch, {uid, payload, ...}}.
SNAPSHOT = (
    _PRELUDE
    + """
reap(ARGV[1])
local epoch = redis.call('GET', KEYS[4])
if not epoch then
  epoch = ARGV[2]
  redis.call('SET', KEYS[4], epoch)
end
local version = tonumber(redis.call('GET', KEYS[3]) or '0')
return {version, epoch, redis.call('HGETALL', KEYS[1])}
"""
)
