"""What one Redis subscription knows, and the events each of its inputs makes
(no I/O: the stream reads the server and feeds it)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import cast
from typing import final
from typing import get_args

from wool import DiscoveryEvent
from wool import DiscoveryEventType
from wool import WorkerMetadata
from wool import protocol

from .._wool.workers import WorkerMap

_TYPES: tuple[str, ...] = get_args(DiscoveryEventType)


class Resync(Exception):
    """The subscription can no longer trust its sequence: read again what it
    missed (an announcement is missing, did not parse, or is from another
    epoch)."""


class Gap(Resync):
    """An announcement is missing: its version was skipped."""


def decode(uid: bytes, payload: bytes) -> WorkerMetadata:
    """The worker metadata a record holds.

    :raises Exception: if ``payload`` is not a ``WorkerMetadata`` protobuf
        of worker ``uid``.
    """
    metadata = WorkerMetadata.from_protobuf(protocol.WorkerMetadata.FromString(payload))
    if str(metadata.uid) != uid.decode():
        raise ValueError(f"record {uid!r} holds the metadata of worker {metadata.uid}")
    return metadata


@final
class SubscriptionState:
    """The workers a subscription has yielded, and where its sequence stands.

    Memory held: one metadata per known worker, and the records of the last
    snapshot (a resync decodes only the changed ones, and warns of an
    invalid one once).
    """

    def __init__(
        self, settle: float, invalid: Callable[[bytes, BaseException], None]
    ) -> None:
        self.settle_seconds = settle
        self._invalid = invalid
        #: The workers yielded: the events passed on are what changes them.
        self.workers = WorkerMap()
        self.held: set[uuid.UUID] = set()
        self.settle_until = 0.0
        self.epoch: bytes | None = None
        self.version = 0
        #: The change of :attr:`version`, as logged, if known (held: one
        #: announcement): a later session resumes after it if the server's
        #: log still holds it.
        self.change: bytes | None = None
        #: The last snapshot's records: uid -> payload, metadata (``None``:
        #: invalid).
        self._records: dict[bytes, tuple[bytes, WorkerMetadata | None]] = {}

    def since(self) -> list[object]:
        """The epoch, version and change last applied, for the snapshot
        script (empty when a session cannot resume)."""
        if self.change is None:
            return ["", "", ""]
        return [self.epoch, self.version, self.change]

    def resume(self, changes: list[bytes]) -> tuple[list[DiscoveryEvent], bool]:
        """The events the changes after :attr:`version` make, and whether
        every one applied (one that does not parse stops them: a snapshot
        must follow)."""
        events: list[DiscoveryEvent] = []
        for change in changes:
            try:
                event = self.message(change)
            except Resync:
                return events, False
            if event is not None:
                events.append(event)
        return events, True

    def snapshot(
        self,
        version: int,
        epoch: bytes,
        flat: list[bytes],
        now: float,
        change: bytes | None = None,
    ) -> tuple[list[DiscoveryEvent], bool]:
        """The events to the snapshot, and whether the server lost its data
        (a new epoch: the workers missing from it are then held until
        :attr:`settle_until`, not dropped). ``change``: the logged change of
        ``version``, if any."""
        lost = self.epoch is not None and epoch != self.epoch
        self.epoch, self.version, self.change = epoch, version, change
        current: dict[uuid.UUID, WorkerMetadata] = {}
        records: dict[bytes, tuple[bytes, WorkerMetadata | None]] = {}
        for uid, payload in zip(flat[::2], flat[1::2], strict=False):
            known = self._records.get(uid)
            if known is not None and known[0] == payload:
                metadata = known[1]
            else:
                try:
                    metadata = decode(uid, payload)
                except Exception as error:
                    metadata = None
                    self._invalid(uid, error)
            records[uid] = (payload, metadata)
            if metadata is not None:
                current[metadata.uid] = metadata
        self._records = records
        missing = [uid for uid in self.workers.workers if uid not in current]
        if lost:  # held: not dropped before the settle time
            current.update((uid, self.workers.workers[uid]) for uid in missing)
        target = WorkerMap(current)
        events = list(self.workers.diff(target))
        self.workers = target
        self.held = set(missing) if lost else set()
        self.settle_until = now + self.settle_seconds
        return events, lost

    def message(self, raw: bytes) -> DiscoveryEvent | None:
        """The event announcement ``raw`` makes, if any.

        :raises Resync: on a gap, another epoch, or an announcement that does
            not parse (reported through ``invalid``; the next session then
            takes a snapshot).
        """
        parts = raw.split(b" ", 4)
        try:
            if len(parts) != 5 or not parts[0].isdigit():
                raise ValueError("not '<version> <epoch> <type> <uid> <metadata>'")
            number, epoch, kind, uid, payload = parts
            version = int(number)
            self.check_epoch(epoch)
            if version <= self.version:
                return None  # already in the snapshot, or a duplicate
            if version != self.version + 1:
                raise Gap(
                    f"an announcement is missing (expected version "
                    f"{self.version + 1}, got {version})"
                )
            text = kind.decode()
            if text not in _TYPES:
                raise ValueError(f"unknown event type {text!r}")
            metadata = decode(uid, payload)
        except Resync:
            raise
        except Exception as error:
            self._invalid(raw[:60], error)
            self.change = None
            raise Resync("an announcement did not parse") from error
        self.version, self.change = version, raw
        self.held.discard(metadata.uid)
        event = DiscoveryEvent(cast(DiscoveryEventType, text), metadata=metadata)
        return self.workers.apply(event)  # never a second add, nor an unknown drop

    def settle(self) -> list[DiscoveryEvent]:
        """Drop the held workers that were not announced again."""
        dropped = [self.workers.drop(uid) for uid in self.held]
        self.held.clear()
        return [event for event in dropped if event is not None]

    def check_epoch(self, epoch: bytes) -> None:
        """:raises Resync: if ``epoch`` (an announcement's or a reap's) is not
        the snapshot's (a flush)."""
        if epoch != self.epoch:
            raise Resync(
                "the server's epoch changed (its data was flushed, evicted or lost)"
            )
