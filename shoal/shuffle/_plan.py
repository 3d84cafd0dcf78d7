"""Which participant owns an output partition: shared by the scheduler (which places
unpack tasks there) and the workers (which send pieces there). Pure."""

from __future__ import annotations

from collections.abc import Sequence


def owner_index(partition: int, nparticipants: int) -> int:
    """Round-robin: two shuffles into the same number of partitions over the same
    participants put output partition ``i`` of both on the same worker (a merge)."""
    return partition % nparticipants


def owner(partition: int, participants: Sequence[str]) -> str:
    return participants[owner_index(partition, len(participants))]
