"""The constructor arguments: their checks, and the frozen records that hold
them (what pickling, equality and the pool key read)."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from typing import Any
from typing import TypeVar

import attrs

from .._pooling.restart import RestartPolicy
from ._connection import parse_url

T = TypeVar("T")


def check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
    if not namespace:
        raise ValueError("namespace must not be empty")
    return namespace


def check_key_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"key_prefix must be a str, got {type(prefix).__name__}")
    if "{" in prefix or "}" in prefix:
        raise ValueError(
            "key_prefix must not contain braces (the namespace's hash tag), "
            f"got {prefix!r}"
        )
    return prefix


def check_hosts(bind_host: object, advertise_host: object) -> None:
    """``bind_host`` and ``advertise_host`` (unless ``None``) are ``str``, and
    ``advertise_host`` is no wildcard: a publisher puts them in the address
    it announces."""
    if not isinstance(bind_host, str):
        raise TypeError(f"bind_host must be a str, got {type(bind_host).__name__}")
    if advertise_host is None:
        return
    if not isinstance(advertise_host, str):
        raise TypeError(
            f"advertise_host must be a str or None, got {type(advertise_host).__name__}"
        )
    if is_wildcard(advertise_host):
        raise ValueError(f"advertise_host must not be a wildcard: {advertise_host!r}")


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (so it cannot be announced)."""
    return host in ("", "0.0.0.0", "::", "[::]")


def check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


_DEFAULT_POLICY = RestartPolicy()


def check_reconnect(policy: object) -> RestartPolicy:
    """:raises TypeError: if ``policy`` is not a :class:`RestartPolicy`.
    :raises ValueError: if it sets ``settle`` or ``restart_on_end``, which
        a Redis subscription cannot apply: each session lists every worker
        in its snapshot (after a data loss, the missing ones are held for
        ``lease`` seconds), and it never ends on its own."""
    if not isinstance(policy, RestartPolicy):
        raise TypeError(f"reconnect must be a RestartPolicy, got {policy!r}")
    for name, why in (
        ("settle", "a new session's snapshot lists every worker at once"),
        ("restart_on_end", "the subscription never ends on its own"),
    ):
        if getattr(policy, name) != getattr(_DEFAULT_POLICY, name):
            raise ValueError(
                f"reconnect.{name} does not apply to a Redis subscription ({why}),"
                f" got {getattr(policy, name)!r}"
            )
    return policy


def check_change_log(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"change_log must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"change_log must be >= 0, got {value!r}")
    return value


def check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


@attrs.frozen
class PublisherSettings:
    """The arguments of :class:`RedisPublisher`, checked, one field each."""

    url: str
    namespace: str
    bind_host: str
    advertise_host: str | None
    lease: float
    connect_timeout: float
    #: Compared by value; out of the hash (a mapping is not hashable).
    client_options: Mapping[str, Any] = attrs.field(hash=False)
    key_prefix: str
    name_connections: bool
    change_log: int


@attrs.frozen
class DiscoverySettings(PublisherSettings):
    """The arguments of :class:`RedisDiscovery`, checked, one field each
    (``reap_interval`` resolved: ``lease / 4`` when not given); what its
    subscribers are made of, and equal for equal subscribers."""

    reap_interval: float
    reconnect: RestartPolicy
    shared: bool
    liveness_timeout: float

    def publisher(self) -> PublisherSettings:
        """The publisher's arguments: each of its fields, taken by name."""
        names = (field.name for field in attrs.fields(PublisherSettings))
        return PublisherSettings(**{name: getattr(self, name) for name in names})

    def key(self) -> Hashable:
        """What subscriptions are shared by: the normalised connection
        (resolving host names), key prefix and namespace."""
        return (parse_url(self.url).key, self.key_prefix, self.namespace)

    def options(self) -> tuple[object, ...]:
        """What a shared subscription runs with, beyond its key."""
        return (
            self.connect_timeout,
            self.reap_interval,
            self.reconnect,
            self.lease,
            self.client_options,
            self.liveness_timeout,
            self.name_connections,
            self.change_log,
        )


def rebuild(cls: Callable[..., T], settings: PublisherSettings) -> T:
    """``cls`` called again with the arguments ``settings`` records (and
    checked again): what an unpickled discovery or publisher is."""
    return cls(**attrs.asdict(settings, recurse=False))


def argument(name: str) -> Any:
    """A read-only attribute: the constructor argument ``name``, read from the
    object's one record (its ``_settings``)."""
    return property(
        operator.attrgetter(f"_settings.{name}"),
        doc=f"The ``{name}`` argument, as checked.",
    )
