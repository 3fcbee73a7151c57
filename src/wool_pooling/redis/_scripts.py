"""The Lua scripts and key layout of a namespace (docs/redis.rst, *Keys, channels
and commands*, *Namespace lifecycle*, *Resuming*).

Every change runs as one script, so the hash, the leases, the version
counter, the change log and the announcement change together: a subscriber
that reads the version (and the hash or the log) in one script, after
subscribing, knows which announcements its read holds.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs

from ._errors import watched

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
    changes: str
    channel: str

    @classmethod
    def of(cls, namespace: str, db: int = 0, prefix: str = DEFAULT_KEY_PREFIX) -> Keys:
        base = f"{prefix}{{{namespace}}}"
        names = ("workers", "leases", "version", "epoch", "changes")
        keys = {name: f"{base}:{name}" for name in names}
        return cls(**keys, channel=f"{base}:events:{db}")

    @property
    def keys(self) -> list[str]:
        return [self.workers, self.leases, self.version, self.epoch, self.changes]


# KEYS: workers, leases, version, epoch, changes. ARGV[1]: channel, ARGV[2]: a
# new epoch (used if the version or the epoch is missing; the log is then
# emptied), ARGV[3]: keep (ms, the idle expiry), ARGV[4]: the log's length.
# Shared prelude: the keys' types checked, the epoch, the server's clock in
# ms, announce(type, uid, payload), which bumps the version, appends the
# change to the log (id 0-<version>) and publishes it, and finish(result),
# which sets the keys' shared expiry and returns result (every script
# returns through it).
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
check(5, 'stream', 'a change log')
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
  redis.call('DEL', KEYS[5])
end
local length = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function announce(kind, uid, payload)
  local version = redis.call('INCR', KEYS[3])
  local change = version .. ' ' .. epoch .. ' ' .. kind .. ' ' .. uid .. ' ' .. payload
  if length > 0 then
    redis.call('XADD', KEYS[5], 'MAXLEN', length, '0-' .. version, 'change', change)
  end
  redis.call('PUBLISH', channel, change)
  return version
end
local keep = tonumber(ARGV[3])
local function finish(result)
  local deadline = keep
  for i = 1, 5 do
    local left = redis.call('PTTL', KEYS[i])
    if left > deadline then deadline = left end
  end
  for i = 1, 5 do
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

#: ARGV: channel, new epoch, keep (ms), log length, type, uid, payload,
#: lease (ms).
#: Returns the announcement's version, or 0 when nothing changed (a drop of
#: an unknown worker, a re-add with the same metadata, which only renews the
#: lease).
PUBLISH = (
    _PRELUDE
    + """
local kind, uid, payload = ARGV[5], ARGV[6], ARGV[7]
local old = redis.call('HGET', KEYS[1], uid)
if kind == 'worker-dropped' then
  redis.call('ZREM', KEYS[2], uid)
  if not old then return finish(0) end
  redis.call('HDEL', KEYS[1], uid)
  return finish(announce('worker-dropped', uid, old))
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[8]), uid)
if old == payload then return finish(0) end
redis.call('HSET', KEYS[1], uid, payload)
return finish(announce(old and 'worker-updated' or 'worker-added', uid, payload))
"""
)

#: ARGV: channel, new epoch, keep (ms), log length, lease (ms), then uid,
#: payload pairs (none: a subscriber's reap).
#: Renews each lease; a record that is gone (expired, or lost with the
#: server's data) is added again. Then drops the records whose lease has
#: expired (announcing each drop). Returns how many records were added
#: again, and the epoch (a subscriber that finds another than its
#: snapshot's takes a new snapshot).
RENEW = (
    _PRELUDE
    + """
local lease = tonumber(ARGV[5])
local readded = 0
for i = 6, #ARGV, 2 do
  local uid, payload = ARGV[i], ARGV[i + 1]
  redis.call('ZADD', KEYS[2], now + lease, uid)
  if redis.call('HSETNX', KEYS[1], uid, payload) == 1 then
    announce('worker-added', uid, payload)
    readded = readded + 1
  end
end
reap()
return finish({readded, epoch})
"""
)

#: ARGV: channel, new epoch, keep (ms), log length, then the epoch, version
#: and change last applied (empty strings for none). Reaps; then, if the log
#: holds that change and every one after it, and they are no more than the
#: records, returns {version, epoch, {change, ...}, 1}, the changes after it;
#: else a snapshot, {version, epoch, {uid, payload, ...}, 0, change}, where
#: change is the logged one of this version (or false).
SNAPSHOT = (
    _PRELUDE
    + """
reap()
local version = tonumber(redis.call('GET', KEYS[3]))
local last = tonumber(ARGV[6])
if ARGV[5] == epoch and last and last <= version
    and version - last <= redis.call('HLEN', KEYS[1]) then
  local log = redis.call('XRANGE', KEYS[5], '0-' .. last, '+')
  if #log == version - last + 1 and log[1][2][2] == ARGV[7] then
    local changes = {}
    for i = 2, #log do changes[i - 1] = log[i][2][2] end
    return finish({version, epoch, changes, 1})
  end
end
local top = redis.call('XRANGE', KEYS[5], '0-' .. version, '0-' .. version)[1]
local flat = redis.call('HGETALL', KEYS[1])
return finish({version, epoch, flat, 0, top and top[2][2] or false})
"""
)


def register(client: Any, cluster: bool, *scripts: str) -> list[Any]:
    """Each of ``scripts`` registered on ``client`` (a cluster's: announcing
    with ``SPUBLISH``)."""
    return [
        client.register_script(sharded(each) if cluster else each) for each in scripts
    ]


async def run(
    script: Any, keys: Keys, keep: int, change_log: int, *rest: object
) -> Any:
    """Run a registered ``script`` on ``keys``: ``keep`` is the keys' idle
    expiry (ms), ``change_log`` the log's length, ``rest`` its own ARGV."""
    args = [keys.channel, uuid.uuid4().hex, keep, change_log, *rest]
    return await watched(script(keys=keys.keys, args=args))


def sharded(script: str) -> str:
    """``script`` announcing with ``SPUBLISH`` (to the channel's shard of a
    cluster) in place of ``PUBLISH`` (to every node)."""
    return script.replace("call('PUBLISH', channel,", "call('SPUBLISH', channel,")
