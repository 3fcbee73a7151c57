"""The Lua scripts and key layout of a namespace (docs/redis.rst, *Keys, channels
and commands*, *Namespace lifecycle*).

Every change runs as one script, so the hash, the leases, the version
counter and the announcement change together: a subscriber that reads the
hash and the version in one script, after subscribing, knows which
announcements its snapshot holds.
"""

from __future__ import annotations

import attrs

#: The prefix of every key and channel, unless ``key_prefix`` says otherwise.
DEFAULT_KEY_PREFIX = "wool:"

#: A namespace's keys expire this many times the larger of ``lease`` and
#: ``reap_interval`` after the last script of its publishers and subscribers.
IDLE_EXPIRY_LEASES = 10

#: The changes a namespace's log keeps, unless ``change_log`` says otherwise.
DEFAULT_CHANGE_LOG = 10_000


def idle_expiry_ms(lease: float, reap_interval: float = 0.0) -> int:
    """How long, in ms, a caller with this ``lease`` (and ``reap_interval``)
    keeps the namespace's keys after its last script."""
    return max(1, round(IDLE_EXPIRY_LEASES * max(lease, reap_interval) * 1000))


@attrs.frozen
class Keys:
    """The keys and channel of one namespace."""

    workers: str
    leases: str
    version: str
    epoch: str
    channel: str

    @classmethod
    def of(cls, namespace: str, db: int = 0, prefix: str = DEFAULT_KEY_PREFIX) -> Keys:
        base = f"{prefix}{{{namespace}}}"
        return cls(
            workers=f"{base}:workers",
            leases=f"{base}:leases",
            version=f"{base}:version",
            epoch=f"{base}:epoch",
            channel=f"{base}:events:{db}",
        )

    @property
    def keys(self) -> list[str]:
        return [self.workers, self.leases, self.version, self.epoch]


# KEYS: workers, leases, version, epoch. ARGV[1]: channel, ARGV[2]: a new epoch
# (used if the version or the epoch is missing), ARGV[3]: keep (ms, the idle
# expiry). Shared prelude: the keys' types checked, the epoch, the server's
# clock in ms, announce(type, uid, payload), which bumps the version and
# publishes, and finish(result), which sets the keys' shared expiry and
# returns result (every script returns through it).
_PRELUDE = """
local function wrong(key, found, wanted)
  error({err = 'WRONGDATA ' .. key .. ' holds ' .. found .. ', not ' .. wanted})
end
local function check(index, wanted, label)
  local found = redis.call('TYPE', KEYS[index])['ok']
  if found ~= 'none' and found ~= wanted then
    wrong(KEYS[index], 'a ' .. found, label)
  end
end
check(1, 'hash', 'a hash')
check(2, 'zset', 'a sorted set')
check(3, 'string', 'a version number')
check(4, 'string', 'an epoch')
local channel = ARGV[1]
local stored = redis.call('GET', KEYS[3])
if stored and not string.match(stored, '^%d+$') then
  wrong(KEYS[3], string.format('%q', string.sub(stored, 1, 40)), 'a version number')
end
local epoch = redis.call('GET', KEYS[4])
if not epoch or not stored then
  epoch = ARGV[2]
  redis.call('SET', KEYS[4], epoch)
  redis.call('SET', KEYS[3], 0)
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function announce(kind, uid, payload)
  local version = redis.call('INCR', KEYS[3])
  redis.call('PUBLISH', channel,
    version .. ' ' .. epoch .. ' ' .. kind .. ' ' .. uid .. ' ' .. payload)
  return version
end
local keep = tonumber(ARGV[3])
local function finish(result)
  local deadline = keep
  for i = 1, 4 do
    local left = redis.call('PTTL', KEYS[i])
    if left > deadline then deadline = left end
  end
  for i = 1, 4 do
    redis.call('PEXPIRE', KEYS[i], deadline)
  end
  return result
end
local function reap()
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, uid in ipairs(expired) do
    redis.call('ZREM', KEYS[2], uid)
    local old = redis.call('HGET', KEYS[1], uid)
    if old then
      redis.call('HDEL', KEYS[1], uid)
      announce('worker-dropped', uid, old)
    end
  end
  return #expired
end
"""

#: ARGV: channel, new epoch, keep (ms), type, uid, payload, lease (ms).
#: Returns the announcement's version, or 0 when nothing changed (a drop of
#: an unknown worker, a re-add with the same metadata, which only renews the
#: lease).
PUBLISH = (
    _PRELUDE
    + """
local kind, uid, payload = ARGV[4], ARGV[5], ARGV[6]
local old = redis.call('HGET', KEYS[1], uid)
if kind == 'worker-dropped' then
  redis.call('ZREM', KEYS[2], uid)
  if not old then return finish(0) end
  redis.call('HDEL', KEYS[1], uid)
  return finish(announce('worker-dropped', uid, old))
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[7]), uid)
if old == payload then return finish(0) end
redis.call('HSET', KEYS[1], uid, payload)
if old then
  return finish(announce('worker-updated', uid, payload))
end
return finish(announce('worker-added', uid, payload))
"""
)

#: ARGV: channel, new epoch, keep (ms), lease (ms), then uid, payload pairs.
#: Renews each lease; a record that is gone (expired, or lost with the
#: server's data) is added again. Then reaps. Returns how many records were
#: added again.
RENEW = (
    _PRELUDE
    + """
local lease = tonumber(ARGV[4])
local readded = 0
for i = 5, #ARGV, 2 do
  local uid, payload = ARGV[i], ARGV[i + 1]
  redis.call('ZADD', KEYS[2], now + lease, uid)
  if redis.call('HSETNX', KEYS[1], uid, payload) == 1 then
    announce('worker-added', uid, payload)
    readded = readded + 1
  end
end
reap()
return finish(readded)
"""
)

#: ARGV: channel, new epoch, keep (ms). Drops the records whose lease has
#: expired (announcing each drop). Returns the epoch (a subscriber that finds
#: another than its snapshot's takes a new snapshot).
REAP = (
    _PRELUDE
    + """
reap()
return finish(epoch)
"""
)

#: ARGV: channel, new epoch, keep (ms). Reaps, then returns {version, epoch,
#: {uid, payload, ...}}.
SNAPSHOT = (
    _PRELUDE
    + """
reap()
local version = tonumber(redis.call('GET', KEYS[3]))
return finish({version, epoch, redis.call('HGETALL', KEYS[1])})
"""
)


_PUBLISH_CALL = "redis.call('PUBLISH', channel,"


def sharded(script: str) -> str:
    """``script`` announcing with ``SPUBLISH`` (to the channel's shard of a
    cluster) in place of ``PUBLISH`` (to every node).

    :raises ValueError: if ``script`` does not announce exactly once.
    """
    if script.count(_PUBLISH_CALL) != 1:
        raise ValueError("a discovery script announces with exactly one PUBLISH")
    return script.replace(_PUBLISH_CALL, "redis.call('SPUBLISH', channel,")
