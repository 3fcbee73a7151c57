"""A resync decodes only the records that changed since the last snapshot.

Decoding a record into ``WorkerMetadata`` is most of what a subscription's
process spends on a snapshot; when a subscription takes a new one (a
reconnect), the records whose bytes it already decoded in the last one are
taken as they were (docs/redis.rst, *Restart herd*).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from wool import WorkerMetadata

from wool_pooling.redis._state import SubscriptionState


def worker(index: int, pid: int = 1) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=index + 1), address="127.0.0.1:1", pid=pid, version="1"
    )


def record(metadata: WorkerMetadata) -> list[bytes]:
    payload = metadata.to_protobuf().SerializeToString()
    return [str(metadata.uid).encode(), payload]


def flat(*workers: WorkerMetadata) -> list[bytes]:
    # Fresh bytes objects each time, as a new reply holds.
    return [bytes(bytearray(part)) for each in workers for part in record(each)]


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The uid of every record decoded from a protobuf, in order."""
    seen: list[str] = []
    original = WorkerMetadata.from_protobuf

    def counted(protobuf: Any) -> WorkerMetadata:
        seen.append(protobuf.uid)
        return original(protobuf)

    monkeypatch.setattr(WorkerMetadata, "from_protobuf", counted)
    return seen


def test_a_resync_of_unchanged_records_decodes_none(decodes: list[str]) -> None:
    """The second snapshot of the same records decodes nothing and passes no
    event; the metadata known are the same objects."""
    state = SubscriptionState(1.0, lambda uid, error: None)
    workers = [worker(index) for index in range(3)]
    events, _ = state.snapshot(1, b"e", flat(*workers), now=0.0)
    assert [event.type for event in events] == ["worker-added"] * 3
    assert len(decodes) == 3
    known = dict(state.workers.workers)
    events, lost = state.snapshot(2, b"e", flat(*workers), now=0.0)
    assert (events, lost) == ([], False)
    assert len(decodes) == 3
    assert all(state.workers.workers[uid] is known[uid] for uid in known)


def test_a_resync_decodes_the_changed_and_new_records_only(
    decodes: list[str],
) -> None:
    """A changed record and a new one are decoded (an update, an add); a
    record gone is dropped; the others are not decoded again."""
    state = SubscriptionState(1.0, lambda uid, error: None)
    state.snapshot(1, b"e", flat(worker(0), worker(1), worker(2)), now=0.0)
    decodes.clear()
    events, _ = state.snapshot(
        2, b"e", flat(worker(0), worker(1, pid=2), worker(3)), 0.0
    )
    assert [(event.type, event.metadata) for event in events] == [
        ("worker-updated", worker(1, pid=2)),
        ("worker-added", worker(3)),
        ("worker-dropped", worker(2)),
    ]
    assert decodes == [str(worker(1).uid), str(worker(3).uid)]


def test_only_the_last_snapshot_s_records_are_remembered(decodes: list[str]) -> None:
    """A record absent from the last snapshot is decoded again when it
    comes back: what is remembered is one snapshot's records, no more."""
    state = SubscriptionState(1.0, lambda uid, error: None)
    state.snapshot(1, b"e", flat(worker(0), worker(1)), now=0.0)
    state.snapshot(2, b"e", flat(worker(0)), now=0.0)
    decodes.clear()
    events, _ = state.snapshot(3, b"e", flat(worker(0), worker(1)), now=0.0)
    assert [event.type for event in events] == ["worker-added"]
    assert decodes == [str(worker(1).uid)]


def test_a_known_payload_under_another_uid_is_still_invalid(
    decodes: list[str],
) -> None:
    """A record holding another worker's known payload is decoded and found
    invalid (reported once), not taken from what was remembered."""
    invalid: list[bytes] = []
    state = SubscriptionState(1.0, lambda uid, error: invalid.append(uid))
    state.snapshot(1, b"e", flat(worker(0)), now=0.0)
    wrong = [str(worker(1).uid).encode(), record(worker(0))[1]]
    events, _ = state.snapshot(2, b"e", flat(worker(0)) + wrong, now=0.0)
    assert events == []
    assert invalid == [wrong[0]]
    assert len(decodes) == 2
