"""The constructor arguments: one record per object, which RedisDiscovery and
RedisPublisher extend, whose read-only fields check them (what pickling,
equality and the pool key read)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from typing import Any

import attrs

from .._pooling.restart import RestartPolicy
from ._connection import check_client_options
from ._connection import parse_url
from ._connection import redact


def check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _seconds(name: str) -> Callable[[object], float]:
    return lambda value: check_seconds(name, value)


def _str(_: object, field: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{field.name} must be a str, got {type(value).__name__}")


def _flag(_: object, field: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{field.name} must be a bool, got {value!r}")


def _change_log(_: object, __: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"change_log must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"change_log must be >= 0, got {value!r}")


def _url(_: object, __: attrs.Attribute[Any], url: object) -> None:
    parse_url(url)


def _namespace(_: object, __: attrs.Attribute[Any], namespace: str) -> None:
    if not namespace:
        raise ValueError("namespace must not be empty")


def _advertise_host(_: object, __: attrs.Attribute[Any], host: object) -> None:
    """``None``, or a ``str`` that is no wildcard: a publisher announces it."""
    if host is not None and not isinstance(host, str):
        raise TypeError(
            f"advertise_host must be a str or None, got {type(host).__name__}"
        )
    if host is not None and is_wildcard(host):
        raise ValueError(f"advertise_host must not be a wildcard: {host!r}")


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (so it cannot be announced)."""
    return host in ("", "0.0.0.0", "::", "[::]")


def _client_options(
    settings: Any, _: attrs.Attribute[Any], options: Mapping[str, Any]
) -> None:
    check_client_options(options, parse_url(settings.url))


def _copy(options: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(
            f"client_options must be a mapping, got {type(options).__name__}"
        )
    return dict(options)


def _key_prefix(_: object, __: attrs.Attribute[Any], prefix: str) -> None:
    if "{" in prefix or "}" in prefix:
        raise ValueError(
            "key_prefix must not contain braces (the namespace's hash tag), "
            f"got {prefix!r}"
        )


_DEFAULT_POLICY = RestartPolicy()


def _reconnect(_: object, __: attrs.Attribute[Any], policy: object) -> None:
    """:raises ValueError: if ``policy`` sets ``settle`` or ``restart_on_end``,
    which a Redis subscription cannot apply (docs/redis.rst, *Reconnects*)."""
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


#: A record of constructor arguments: each field read-only once checked,
#: compared and hashed by value (``client_options`` out of the hash).
_record = attrs.define(on_setattr=attrs.setters.frozen, unsafe_hash=True, repr=False)


@_record
class PublisherSettings:
    """The arguments of :class:`RedisPublisher`, checked, one field each."""

    #: The ``url`` argument.
    url: str = attrs.field(validator=_url)
    #: The ``namespace`` argument.
    namespace: str = attrs.field(validator=[_str, _namespace])
    #: The ``bind_host`` argument.
    bind_host: str = attrs.field(validator=_str)
    #: The ``advertise_host`` argument.
    advertise_host: str | None = attrs.field(validator=_advertise_host)
    #: The ``lease`` argument, in seconds.
    lease: float = attrs.field(converter=_seconds("lease"))
    #: The ``connect_timeout`` argument, in seconds.
    connect_timeout: float = attrs.field(converter=_seconds("connect_timeout"))
    #: A checked copy of the ``client_options`` argument.
    client_options: Mapping[str, Any] = attrs.field(
        hash=False, converter=_copy, validator=_client_options
    )
    #: The ``key_prefix`` argument.
    key_prefix: str = attrs.field(validator=[_str, _key_prefix])
    #: The ``name_connections`` argument.
    name_connections: bool = attrs.field(validator=_flag)
    #: The ``change_log`` argument.
    change_log: int = attrs.field(validator=_change_log)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its arguments, every one (checked again when unpickled)."""
        return (functools.partial(type(self), **arguments_of(self)), ())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact(self.url)!r}, {self.namespace!r})"


@_record
class DiscoverySettings(PublisherSettings):
    """The arguments of :class:`RedisDiscovery`, checked: what its
    subscribers are made of."""

    #: The ``reap_interval`` argument (``lease / 4`` unless given).
    reap_interval: float = attrs.field(converter=_seconds("reap_interval"))
    #: The ``reconnect`` argument.
    reconnect: RestartPolicy = attrs.field(validator=_reconnect)
    #: The ``shared`` argument.
    shared: bool
    #: The ``liveness_timeout`` argument, in seconds.
    liveness_timeout: float = attrs.field(converter=_seconds("liveness_timeout"))


def arguments_of(
    settings: PublisherSettings, of: type[PublisherSettings] | None = None
) -> dict[str, Any]:
    """The arguments of ``settings``, by name (only those of record ``of``, if
    given): what the object is built again from, when unpickled."""
    fields = attrs.fields(of or type(settings))
    return {field.name: getattr(settings, field.name) for field in fields}


def subscription_key(settings: DiscoverySettings) -> Hashable:
    """What subscriptions are shared by (docs/redis.rst, *One subscription
    per connection*)."""
    return (parse_url(settings.url).key, settings.key_prefix, settings.namespace)


def run_options(settings: DiscoverySettings) -> tuple[object, ...]:
    """What a shared subscription runs with, beyond its key."""
    return attrs.astuple(settings, recurse=False, filter=_NOT_RUN_OPTIONS)


_NOT_RUN_OPTIONS = attrs.filters.exclude(
    "url", "namespace", "key_prefix", "bind_host", "advertise_host", "shared"
)
