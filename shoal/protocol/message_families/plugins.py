"""Plugins (shoal/plugins/), ``client.run`` and published datasets."""

from __future__ import annotations

from typing import Any

import msgspec

from shoal.protocol.message_families.base import (
    Key,
    Message,
)

# The one place a server unpickles what a client sent: a scheduler plugin. Worker and
# nanny plugins pass through the scheduler as opaque bytes.


class RegisterPlugin(Message):
    """Client -> scheduler (``kind`` "scheduler", "worker" or "nanny"); scheduler ->
    worker or nanny (request_id 0: one that joined later, no answer wanted)."""

    request_id: int
    kind: str
    name: str
    plugin: bytes  # pickled by the client; unpickled only by the processes it is for
    idempotent: bool = False


class UnregisterPlugin(Message):
    request_id: int
    name: str
    kind: str = ""  # "": whichever kind has a plugin of that name


class PluginResult(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    status: str  # "OK" or "error"
    error: str = ""  # "TypeName: message"
    traceback: str = ""


class PluginReply(Message):
    """What each process said (by worker address, nanny name, or "scheduler"), or
    ``error`` when the request was refused as a whole (``error_type`` names the
    exception the client raises: "ValueError", "PermissionError")."""

    request_id: int
    kind: str = ""
    results: dict[str, PluginResult] = {}
    error: str = ""
    error_type: str = ""


class LogEvent(Message):
    """Worker or nanny -> scheduler: record ``data`` in the event log under ``topic``."""

    topic: str
    data: dict[str, Any]
    stimulus_id: str = ""


class RunFunction(Message):
    """Client -> worker (``client.run``) or scheduler (``client.run_on_scheduler``):
    call a function there, outside the task graph. The scheduler unpickles it only
    from a client that proved the cluster token (as it does plugins)."""

    request_id: int
    call: bytes  # cloudpickled (function, args, kwargs)


class RunReply(Message):
    """The answer to :class:`RunFunction`: ``status`` "OK" (``result`` is the pickled
    return value) or "error" (``result`` the pickled exception, ``error`` its text);
    ``error_type`` "PermissionError" when the request was refused as a whole."""

    request_id: int
    status: str
    result: bytes = b""
    error: str = ""
    error_type: str = ""


class PublishDataset(Message):
    """Client -> scheduler: keep ``keys`` under ``name`` with ``data`` (the published
    object, pickled with its futures as references to ``keys``)."""

    request_id: int
    name: str
    keys: list[Key]
    data: bytes
    override: bool = False


class DatasetRequest(Message):
    """Client -> scheduler: ``op`` "get", "unpublish" (the dataset ``name``) or "list"."""

    request_id: int
    op: str
    name: str = ""


class DatasetReply(Message):
    """The answer to :class:`PublishDataset` / :class:`DatasetRequest`; ``error`` when
    refused (no such dataset, a name already taken)."""

    request_id: int
    names: list[str] = []
    keys: list[Key] = []
    data: bytes = b""
    error: str = ""
