"""The worker state machine's vocabulary: the events the worker server makes itself
(ComputeTask, FreeKeys and CopyKeys, wire messages, are events too) and the
instructions :class:`~shoal.core.worker.state.WorkerState` hands back."""

from __future__ import annotations

from typing import Any

import msgspec

from shoal.protocol import messages as m
from shoal.protocol.messages import ComputeTask, FreeKeys, Key, Message, Payload

# --- events (ComputeTask and FreeKeys, wire messages, are events too) ---------------------


class WorkerEvent(msgspec.Struct):
    """Base of the events the worker server makes itself."""


class ExecuteSuccess(WorkerEvent):
    key: Key
    value: Any
    nbytes: int
    inline: Payload | None
    type_name: str
    start: float
    stop: float
    stimulus_id: str


class ExecuteFailure(WorkerEvent):
    key: Key
    exception: Payload
    traceback: str
    start: float
    stop: float
    stimulus_id: str


class TransferError(msgspec.Struct, frozen=True):
    """Why the data of a key cannot be had from a peer, for good: the peer cannot
    pickle it, we cannot unpickle it, or it is larger than our memory limit."""

    reason: str
    exception: Payload  # what the task erred with (the original one, if unpickling raised)


class GatherSuccess(WorkerEvent):
    """A GatherDep ended; asked keys absent from ``data`` and ``failed`` count as
    missing. Nothing in ``failed`` is data: no stand-in is ever stored or reported."""

    worker: str
    data: dict[Key, Any]
    nbytes: dict[Key, int]
    missing: list[Key]
    stimulus_id: str
    failed: dict[Key, TransferError] = {}


class GatherFailure(WorkerEvent):
    """A GatherDep ended because the peer could not be reached."""

    worker: str
    keys: list[Key]
    stimulus_id: str


class UpdateDataEvent(WorkerEvent):
    """A client scattered data here."""

    data: dict[Key, Any]
    nbytes: dict[Key, int]
    stimulus_id: str


class Pause(WorkerEvent):
    """Memory is over the pause fraction: start no task, fetch no data."""

    stimulus_id: str


class Unpause(WorkerEvent):
    """Memory is back under the pause fraction."""

    stimulus_id: str


class UnserializableData(WorkerEvent):
    """The result of ``key`` could not be pickled to spill it or to send it to a peer."""

    key: Key
    reason: str
    stimulus_id: str


class Secede(WorkerEvent):
    """The running task ``key`` leaves the thread count (it waits on other tasks)."""

    key: Key
    stimulus_id: str


class Rejoin(WorkerEvent):
    """The seceded task ``key`` asks to count again; its thread waits for ResumeThread."""

    key: Key
    stimulus_id: str


class InterruptExpired(WorkerEvent):
    """The grace period after :class:`Interrupt` ``interrupt_id`` of ``key`` is over."""

    key: Key
    interrupt_id: int
    stimulus_id: str


Event = ComputeTask | FreeKeys | m.ReleaseCompute | m.CopyKeys | m.StealRequest | WorkerEvent

# --- instructions -----------------------------------------------------------------------


class Instruction(msgspec.Struct, gc=False):
    """Base of what the server must do after a call to ``handle``."""


class Execute(Instruction):
    key: Key
    stimulus_id: str


class GatherDep(Instruction):
    worker: str
    keys: list[Key]
    total_nbytes: int
    stimulus_id: str


class ResumeThread(Instruction):
    """A thread slot is free for the rejoining task ``key``: let its thread go on."""

    key: Key
    stimulus_id: str


class Interrupt(Instruction):
    """Raise :class:`~shoal.TaskInterrupted` in the thread running ``key`` (only while
    it still runs that execution; one not started yet is not run at all), then, after a
    grace period, send :class:`InterruptExpired` with the same ``interrupt_id``."""

    key: Key
    interrupt_id: int
    stimulus_id: str


class RestartWorker(Instruction):
    """A thread could not be stopped: restart this worker through its nanny (nothing
    counts as a failure); without a nanny, say so and keep the thread counted busy."""

    reason: str
    stimulus_id: str


class SendMessage(Instruction):
    msg: Message
    stimulus_id: str
