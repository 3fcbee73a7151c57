"""Where a Redis discovery connects: url parsing, pool keys, redaction, clients."""

from __future__ import annotations

import functools
import inspect
import os
import re
import socket
import ssl
import string
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

import attrs
import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection as PlainConnection
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.connection import SSLConnection
from redis.asyncio.connection import UnixDomainSocketConnection
from redis.asyncio.connection import parse_url as parse_redis_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError
from redis.asyncio.sentinel import Sentinel
from redis.asyncio.sentinel import SentinelManagedSSLConnection
from redis.backoff import EqualJitterBackoff
from redis.backoff import NoBackoff

from .._core.signatures import did_you_mean

if TYPE_CHECKING:
    from ._settings import PublisherSettings

#: What Redis appends to an error raised in a script.
_SCRIPT_SUFFIX = re.compile(r"\s*script: [0-9a-f]+, on @user_script:\d+\.?$")

#: The schemes docs/redis.rst lists under *Urls*.
_SCHEME = re.compile(r"rediss?|unix|rediss?\+(sentinel|cluster)")

#: ``client_options`` the discovery sets itself: each connection must name
#: itself, read bytes, and end (not silently reconnect) when it is lost.
RESERVED_CLIENT_OPTIONS = frozenset(
    {
        "client_name",
        "decode_responses",
        "retry",
        "retry_on_error",
        "retry_on_timeout",
        "connection_pool",
        "single_connection_client",
        "url",
        "host",
        "port",
        "path",
        "db",
        "startup_nodes",
    }
)


@attrs.frozen
class Target:
    """A parsed, checked url; :attr:`key` is its normalised connection
    (docs/redis.rst, *One subscription per connection*)."""

    url: str
    scheme: str
    hosts: tuple[tuple[str, int], ...]
    path: str | None
    db: int
    username: str | None
    service: str | None

    @property
    def cluster(self) -> bool:
        return self.scheme.endswith("+cluster")

    @property
    def key(self) -> tuple[object, ...]:
        hosts = tuple((_resolved(host), port) for host, port in self.hosts)
        if self.cluster:  # seeds of one cluster: their order does not matter
            hosts = tuple(sorted(set(hosts)))
        where = hosts if self.path is None else os.path.realpath(self.path)
        scheme = "redis" if self.scheme == "unix" else self.scheme
        return (scheme, where, self.service, self.db, self.username)


@functools.lru_cache(maxsize=256)
def _resolved(host: str) -> str:
    """``host`` as one address (IPv4 first); lowercased if it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return host.lower()
    # (never an empty list: getaddrinfo raises when nothing resolves)
    return min(
        (family != socket.AF_INET, str(info[0])) for family, _, _, _, info in infos
    )[1]


def parse_url(url: object) -> Target:
    """Check ``url`` and return what it names (the forms: docs/redis.rst, *Urls*).

    :raises TypeError: if ``url`` is not a ``str``.
    :raises ValueError: if it is malformed.
    """
    if not isinstance(url, str):
        raise TypeError(f"a Redis url must be a str, got {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or not _SCHEME.fullmatch(scheme):
        raise ValueError(
            f"a Redis url starts with redis://, rediss://, unix://, redis+sentinel://, "
            f"rediss+sentinel://, redis+cluster:// or rediss+cluster://, "
            f"got {redact(url)!r}"
        )
    try:
        return _parse(url, scheme)
    except ValueError as error:
        raise ValueError(f"invalid Redis url {redact(url)!r}: {error}") from None


def _parse(url: str, scheme: str) -> Target:
    """What ``url`` names, each node read by redis-py's ``parse_url``."""
    if scheme == "unix":
        found = parse_redis_url(url)
        path = found.get("path", "")
        if not path.startswith("/"):
            raise ValueError("a unix:// url needs an absolute socket path")
        db = found.get("db", 0)
        return Target(url, scheme, (), path, db, found.get("username"), None)
    location = url.partition("://")[2].partition("#")[0].partition("?")[0]
    netloc, _, path = location.rpartition("@")[2].partition("/")
    service = None
    if scheme.endswith("+sentinel"):
        if "?" in url:
            raise ValueError("a Sentinel url takes no query (give client_options)")
        service, _, path = path.partition("/")
        if not service:
            raise ValueError(
                "a Sentinel url names the monitored master: "
                "redis+sentinel://host:port[,host:port...]/service_name[/db]"
            )
    if path and not path.isdigit():
        raise ValueError(f"invalid database {path!r}")
    default = 6379 if service is None else 26379
    nodes = [parse_redis_url(node_url(url, node, path)) for node in netloc.split(",")]
    hosts = tuple((node.get("host", ""), node.get("port", default)) for node in nodes)
    if not all(host for host, _ in hosts):
        raise ValueError(f"a Redis url needs a host, got {netloc!r}")
    db, username = nodes[0].get("db", 0), nodes[0].get("username")
    if scheme.endswith("+cluster") and db:
        raise ValueError(f"a Redis Cluster has database 0 only, got {db}")
    if scheme.endswith("+cluster") and not hasattr(PubSub, "ssubscribe"):
        raise ValueError("a Redis Cluster url needs redis-py 8.0 or later")
    return Target(url, scheme, hosts, None, db, username, service)


def address(host: str, port: object) -> str:
    """``host:port``, an IPv6 host in brackets."""
    bare = ":" in host and not host.startswith("[")
    return f"[{host}]:{port}" if bare else f"{host}:{port}"


def node_url(url: str, node: str, db: str = "0") -> str:
    """The ``redis://`` (or ``rediss://``) url of one ``host:port`` the url
    ``url`` names, with its user, password and query."""
    scheme, _, rest = url.partition("://")
    rest, qmark, query = rest.partition("#")[0].partition("?")
    userinfo, at, _ = rest.rpartition("@")
    plain = scheme.lower().partition("+")[0]
    return f"{plain}://{userinfo}{at}{node}/{db}{qmark}{query}"


def redact(url: str) -> str:
    """``url`` without its passwords (after the user, and in any
    ``password=`` or ``sentinel_password=`` query parameter), for messages
    and logs; malformed urls included."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<a Redis url>" if "@" in url or "password" in url else url
    rest, qmark, query = rest.partition("?")
    userinfo, at, location = rest.rpartition("@")
    if at:
        user = userinfo.partition(":")[0]
        rest = f"{user}@{location}" if user else location
    if qmark:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = urllib.parse.urlencode(
            [(name, value) for name, value in pairs if "password" not in name.lower()],
            safe="/:",
        )
    return f"{scheme}://{rest}?{query}" if query else f"{scheme}://{rest}"


#: The server's error codes that redis-py turns into classes (and drops
#: from the message): put back, so a message says what the server said.
_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (redis_errors.AuthenticationWrongNumberOfArgsError, "ERR"),
    (redis_errors.AuthenticationError, "WRONGPASS"),
    (redis_errors.NoPermissionError, "NOPERM"),
    (redis_errors.ReadOnlyError, "READONLY"),
    (redis_errors.BusyLoadingError, "LOADING"),
    (redis_errors.NoScriptError, "NOSCRIPT"),
)


def reason(error: BaseException) -> str:
    """The error's type and message, or its cause's if it has none."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = _SCRIPT_SUFFIX.sub("", str(current)).strip()
        if text:
            # (a SentinelAuthenticationError quotes the sentinel's reason, code
            # included)
            codes = () if isinstance(current, SentinelAuthenticationError) else _CODES
            code = next((code for cls, code in codes if isinstance(current, cls)), "")
            if not text.startswith(code):
                text = f"{code} {text}"
            return f"{type(current).__name__}: {text}"
        current = current.__cause__ or current.__context__
    return type(error).__name__


def check_client_options(options: Mapping[str, Any], target: Target) -> None:
    """Check ``options`` against ``target`` (docs/redis.rst, *Options and
    their precedence*).

    :raises TypeError: if a key is not a ``str``, ``ssl_context`` is not an
        :class:`ssl.SSLContext`, or redis-py's client does not take a key
        for the url's scheme.
    :raises ValueError: for an option the discovery sets itself, a TLS
        option for a url without TLS, or ``ssl_context`` with a Redis
        Cluster url.
    """
    reserved = sorted(RESERVED_CLIENT_OPTIONS.intersection(options))
    if reserved:
        raise ValueError(
            f"client_options may not set {', '.join(reserved)}: the discovery "
            "sets those itself (the url gives host, port, path, db and a "
            "cluster's seed nodes)"
        )
    url = redact(target.url)
    if target.cluster and "ssl_context" in options:
        raise ValueError(
            "client_options ssl_context is not supported with a Redis Cluster "
            "url (redis-py's RedisCluster builds its own TLS connections): give "
            "the ssl_* options (ssl_ca_certs, ssl_certfile, ssl_keyfile, ...) "
            f"in its place, for {url!r}"
        )
    context = options.get("ssl_context")
    if "ssl_context" in options and not isinstance(context, ssl.SSLContext):
        raise TypeError(
            "client_options ssl_context must be an ssl.SSLContext, got "
            f"{type(context).__name__}"
        )
    tls = target.scheme.startswith("rediss")
    known = client_option_names(target.scheme, unix=target.path is not None)
    for name in options:
        if not isinstance(name, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"client_options keys must be str, got {name!r}")
        if not tls and (name == "ssl" or name.startswith("ssl_")):
            raise ValueError(
                f"client_options {name} needs a TLS url (rediss:// or "
                f"rediss+sentinel://), got {url!r}"
            )
        if name not in known:
            raise TypeError(
                f"client_options {name} is not a keyword of redis-py's client "
                f"for a {target.scheme}:// url{did_you_mean(name, known)}"
            )


@functools.cache
def client_option_names(scheme: str, *, unix: bool = False) -> frozenset[str]:
    """The keywords of the connection class redis-py builds for a url of
    ``scheme``, of its pool (and ``Sentinel`` or ``RedisCluster``), and
    ``ssl_context``, read from their signatures."""
    # (a Sentinel-managed connection takes what the plain one takes)
    connection: type = SSLConnection if scheme.startswith("rediss") else PlainConnection
    if unix:
        connection = UnixDomainSocketConnection
    names = _keywords(connection) | _keywords(ConnectionPool, own=True)
    if scheme.endswith("+cluster"):
        names |= _keywords(RedisCluster, own=True)
    if scheme.endswith("+sentinel"):
        names |= _keywords(Sentinel, own=True) | {"check_connection", "ssl"}
    # The sentinels are set from the url: never the caller's.
    return frozenset(names - {"self", "sentinels"} | {"ssl_context"})


def _keywords(cls: type, *, own: bool = False) -> set[str]:
    """The keyword parameters of ``cls.__init__`` and (unless ``own``) of
    the bases it hands its ``**kwargs`` to."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
        names.update(each.name for each in parameters if each.kind in _KEYWORD_KINDS)
        if own or all(each.kind is not each.VAR_KEYWORD for each in parameters):
            break
    return names


_KEYWORD_KINDS = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)


class _GivenContextSSLConnection(SSLConnection):
    """redis-py's TLS connection, with the ``ssl.SSLContext`` it is given."""

    def __init__(self, *, ssl_context: ssl.SSLContext, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # pyright: ignore[reportUnknownMemberType]
        self.ssl_context.context = ssl_context


class _GivenContextSentinelSSLConnection(
    _GivenContextSSLConnection, SentinelManagedSSLConnection
):
    """The same, to a Sentinel-monitored master."""


def client_name(role: str, namespace: str) -> str:
    """``wool-pooling:<role>:<namespace>:<host>:<pid>``: who holds a
    connection, for ``CLIENT LIST``; percent-encoded outside ``!``..``~``,
    as ``CLIENT SETNAME`` needs."""
    name = f"wool-pooling:{role}:{namespace}:{socket.gethostname()}:{os.getpid()}"
    safe = string.punctuation.replace("%", "")  # (letters and digits are)
    return urllib.parse.quote(name, safe=safe, errors="replace")


class SentinelAuthenticationError(redis_errors.AuthenticationError):
    """A sentinel refused to authenticate the client, so no master can be found."""


class _Sentinels(Sentinel):
    """redis-py's ``Sentinel``; when no master is found, the first sentinel
    refusing authentication is named (docs/redis.rst, *Sentinel with
    passwords*)."""

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        except MasterNotFoundError as not_found:
            for each in self.sentinels:
                try:
                    await each.ping()  # pyright: ignore[reportUnknownMemberType]
                except redis_errors.AuthenticationError as error:
                    kwargs = each.get_connection_kwargs()
                    where = f"{kwargs.get('host')}:{kwargs.get('port')}"
                    raise SentinelAuthenticationError(
                        f"the sentinel at {where} refused authentication, so "
                        f"no master for {service_name!r} could be found: "
                        f"{reason(error)} (the url's user and password are "
                        "the sentinels' too, unless client_options "
                        "sentinel_kwargs gives theirs)"
                    ) from not_found
                except (redis_errors.RedisError, OSError):
                    continue
            raise


def _no_client_commands() -> dict[str, Any]:
    """Options that make redis-py send no ``CLIENT`` command of its own: those
    its asyncio connections take (``driver_info`` from 8.0, maintenance
    notifications in later 8.x), so each branch runs with some versions only."""
    known = client_option_names("redis")
    quiet: dict[str, Any] = {"lib_name": None, "lib_version": None}
    if "driver_info" in known:  # pragma: no branch
        quiet = {"driver_info": None}
    if "maint_notifications_config" in known:  # pragma: no branch
        from redis.maint_notifications import MaintNotificationsConfig

        quiet["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return quiet


@attrs.define
class Connection:
    """A redis-py asyncio client, and the clients of its sentinels, closed
    with it."""

    client: Any
    sentinels: Any = ()

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        finally:
            for each in self.sentinels:
                await each.aclose()


def open_client(
    target: Target,
    role: str,
    settings: PublisherSettings,
    *,
    retries: int,
) -> Connection:
    """A client for ``target`` with the options of ``settings`` that its
    client takes (a cluster node's takes no ``RedisCluster`` option), by the
    precedence of docs/redis.rst, *Options and their precedence*."""
    timeout, named = settings.connect_timeout, settings.name_connections
    options: dict[str, Any] = {
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
    }
    if target.path is None:
        options["socket_keepalive"] = True
    if target.cluster:
        options["require_full_coverage"] = False
    known = client_option_names(target.scheme, unix=target.path is not None)
    chosen = settings.client_options
    options.update({name: chosen[name] for name in chosen if name in known})
    quiet = {} if named else _no_client_commands()
    options.update(
        quiet,
        client_name=client_name(role, settings.namespace) if named else None,
        retry=Retry(EqualJitterBackoff(cap=timeout, base=0.05), retries),
        retry_on_error=[redis_errors.ConnectionError, redis_errors.TimeoutError],
    )
    if not target.cluster and target.service is None:  # neither: one server
        # The url wins over the options; a given context's class over the url's.
        arguments: dict[str, Any] = {**options, **parse_redis_url(target.url)}
        if "ssl_context" in options:
            arguments["connection_class"] = _GivenContextSSLConnection
        return Connection(aioredis.Redis.from_pool(ConnectionPool(**arguments)))
    # The seeds' user, password and query options, from the url.
    seed = parse_redis_url(node_url(target.url, address(*target.hosts[0])))
    for name in ("host", "port", "db", "connection_class"):
        seed.pop(name, None)
    options.update(seed, ssl=target.scheme.startswith("rediss"))
    if target.cluster:
        nodes = [ClusterNode(host, port) for host, port in target.hosts]
        return Connection(RedisCluster(startup_nodes=nodes, **options))
    if "ssl_context" in options:
        options["connection_class"] = _GivenContextSentinelSSLConnection
    sentinel_options = options.pop("sentinel_kwargs", None)
    if sentinel_options is None:
        # The url names the sentinels: its credentials are theirs too.
        sentinel_options = {
            name: value
            for name, value in options.items()
            if name.startswith("socket_") or name in seed or name in quiet
        }
    # One attempt per sentinel: the next sentinel is the retry (redis-py's
    # default retry would ask a refusing sentinel again for seconds).
    sentinel_options = {"retry": Retry(NoBackoff(), 0), **sentinel_options}
    sentinel = _Sentinels(
        list(target.hosts), sentinel_kwargs=sentinel_options, **options
    )
    client = sentinel.master_for(  # pyright: ignore[reportUnknownMemberType]
        target.service or "", db=target.db
    )
    return Connection(client, sentinel.sentinels)
