"""Data transfer: where results live and how they move between workers (peer to
peer fetches, scatter, copies on retirement, replication and rebalancing).
"""

from __future__ import annotations

from shoal.protocol.message_families.base import (
    Key,
    Message,
    Payload,
    check_decoded_key,
    check_parallel,
)
from shoal.protocol.message_families.tasks import DepInfo

# --- client -> scheduler -------------------------------------------------------------


class ScatterDone(Message):
    """Data the client placed on ``worker``: the scheduler records it as in memory."""

    keys: list[Key]
    nbytes: list[int]
    worker: str
    stimulus_id: str = ""

    def __post_init__(self) -> None:
        check_parallel(self, "nbytes", self.nbytes, "sizes")
        for key in self.keys:
            check_decoded_key(key)


# --- worker -> scheduler -------------------------------------------------------------


class AddKeys(Message):
    """The worker now holds these keys (fetched replicas or scattered data)."""

    keys: list[Key]
    nbytes: list[int]
    stimulus_id: str = ""

    def __post_init__(self) -> None:
        check_parallel(self, "nbytes", self.nbytes, "sizes")


class MissingData(Message):
    """``key`` could not run: ``missing`` were not found on any worker we were told of.
    ``tried[i]`` names the peers asked for ``missing[i]`` that did not deliver it: copies
    the scheduler learned of since are not lost (None: every copy is treated as lost)."""

    key: Key
    missing: list[Key]
    stimulus_id: str = ""
    tried: list[list[str]] | None = None


# --- peer to peer (worker <-> worker, client -> worker) ------------------------------


class GetData(Message):
    request_id: int
    keys: list[Key]
    # The asker's host identity (shoal.comm.cross_memory.host_identity), "" if none: a
    # holder with the same one may lend its buffers instead of sending them.
    host: str = ""


class DataReply(Message):
    """The values asked for. Their out-of-band buffers follow in the frame, or, when
    ``lease`` is set, stay in the memory of process ``lender`` on this host at
    ``lent`` (address, nbytes; one per buffer, payload order), for the asker to copy
    and then hand back with ``ReturnLease`` (shoal.comm.same_host)."""

    request_id: int
    keys: list[Key]
    payloads: list[Payload]
    missing: list[Key] = []
    failed: list[tuple[Key, str]] = []  # held, but could not be serialised: why
    lease: int = 0
    lender: int = 0
    lent: list[tuple[int, int]] = []

    def __post_init__(self) -> None:
        check_parallel(self, "payloads", self.payloads, "payloads")
        if self.lease:
            claimed = sum(p.nbuffers for p in self.payloads)
            if len(self.lent) != claimed:
                raise ValueError(f"a lease of {len(self.lent)} buffers for payloads of {claimed}")
            if self.lender <= 0:
                raise ValueError(f"a lease from process {self.lender}")
            for address, nbytes in self.lent:
                if address < 0 or nbytes < 0:
                    raise ValueError(f"a lent buffer at {address} of {nbytes} bytes")
        elif self.lent:
            raise ValueError("lent buffers without a lease")


class ReturnLease(Message):
    """The asker copied (or gave up on) the buffers of ``lease``: the holder may let
    them go. Answered by ``LeaseReturned``."""

    request_id: int
    lease: int


class LeaseReturned(Message):
    """``held``: the lease was still held when returned, so every byte copied under it
    was the value's (False: it had expired or was never made; discard the copy)."""

    request_id: int
    held: bool


class UpdateData(Message):
    request_id: int
    keys: list[Key]
    payloads: list[Payload]

    def __post_init__(self) -> None:
        check_parallel(self, "payloads", self.payloads, "payloads")


class Ack(Message):
    request_id: int
    nbytes: list[int] = []


# --- scheduler -> worker -------------------------------------------------------------


class CopyKeys(Message):
    """Scheduler -> worker: fetch replicas of these keys from their holders and keep
    them (used to move data off a retiring worker)."""

    deps: list[DepInfo]
    stimulus_id: str = ""


# --- client <-> scheduler ------------------------------------------------------------


class ReplicateKeys(Message):
    """Client -> scheduler (``client.replicate``): have ``n`` workers (-1: all) among
    ``workers`` (names or addresses; empty: all) hold each key in memory."""

    keys: list[Key]
    n: int = -1
    workers: list[str] = []
    stimulus_id: str = ""


class RebalanceRequest(Message):
    """Client -> scheduler (``client.rebalance``): move keys in memory (``keys``; None:
    every key) between ``workers`` (names or addresses; empty: all) so that their
    managed bytes even out; answered with :class:`RebalanceReply` once every move is
    over (a copy confirmed and the source dropped, or given up). See
    ``shoal/core/scheduler/rebalance.py`` for the thresholds."""

    request_id: int
    keys: list[Key] | None = None
    workers: list[str] = []
    stimulus_id: str = ""
    # Dask's thresholds, fractions of each worker's memory limit (the client's config)
    sender_min: float = 0.3
    recipient_max: float = 0.6
    sender_recipient_gap: float = 0.1

    def __post_init__(self) -> None:
        for name in ("sender_min", "recipient_max", "sender_recipient_gap"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"RebalanceRequest.{name} must be a fraction in [0, 1]: {value}")


class RebalanceReply(Message):
    """Scheduler -> client: ``moved`` keys now live on their recipients only (of the
    two); ``abandoned`` moves did not happen (copy failed or too slow, a worker left,
    the key was released) and left the key where it was."""

    request_id: int
    moved: int
    abandoned: int
