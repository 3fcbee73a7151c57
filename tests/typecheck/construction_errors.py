"""What a type checker must reject about a constructed subscription.

Not collected by pytest: ``tests/test_typecheck.py`` runs ``pyright`` in
strict mode over it and requires exactly the errors marked
``# expect: <rule>`` on their lines, no more, no fewer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from wool import DiscoveryEvent

from wool_pooling import shared_subscription


@shared_subscription
class Sub:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        return
        yield

    async def aclose(self) -> None:
        pass


async def misuse() -> None:
    sub = Sub("prod")
    print(sub.namespace)  # expect: reportAttributeAccessIssue
    await sub.aclose()  # expect: reportAttributeAccessIssue
    print(isinstance(sub, Sub))  # expect: reportArgumentType
    Sub(3)  # expect: reportArgumentType
    Sub()  # expect: reportCallIssue


class Sub2(Sub):  # expect: reportGeneralTypeIssues
    pass
