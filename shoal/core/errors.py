"""Errors the scheduler sets on tasks itself, as wire payloads."""

from __future__ import annotations

import pickle

from shoal.protocol.messages import Payload
from shoal.protocol.serialize import PICKLE


def error_payload(exc: BaseException) -> Payload:
    """An exception made by the scheduler itself (shoal's or builtin types only: the
    scheduler never pickles user objects)."""
    return Payload(PICKLE, pickle.dumps(exc, protocol=5))
