"""Checks of the constructor arguments, and the key layout they name."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from .._pooling.restart import RestartPolicy
from ._connection import Target
from ._scripts import DEFAULT_KEY_PREFIX
from ._scripts import Keys


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


def check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def keys_for(target: Target, namespace: str, prefix: str) -> Keys:
    return Keys.of(namespace, target.db, prefix)


@attrs.frozen
class SubscriberOptions:
    """The subscriber's settings (picklable if ``client_options`` are)."""

    connect_timeout: float
    reap_interval: float
    reconnect: RestartPolicy
    #: After the server lost its data: seconds to wait for publishers to add
    #: their workers again before dropping the ones they do not.
    settle: float
    key_prefix: str = DEFAULT_KEY_PREFIX
    client_options: Mapping[str, Any] = attrs.field(
        factory=lambda: dict[str, Any](), hash=False
    )
