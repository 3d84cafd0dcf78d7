"""What every message family builds on: task keys (and their checks), resource
amounts, :class:`Payload` (a serialised user object) and the :class:`Message` base.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

# A task key: a string, or a tuple like Dask's ("name", i, j). Tuple elements are
# typed (to a fixed nesting depth, as msgspec has no recursive aliases) so that nested
# tuples decode as tuples and every decoded key is hashable.
_KeyAtom = int | float | str
_KeyTuple3 = tuple[_KeyAtom, ...]
_KeyTuple2 = tuple[_KeyAtom | _KeyTuple3, ...]
_KeyTuple1 = tuple[_KeyAtom | _KeyTuple2, ...]
Key = str | int | float | _KeyTuple1  # Dask's keys: str, int, float, or tuples of them


def check_key(key: object) -> None:
    """Raise TypeError, naming the key, for one that cannot be a key: as Dask, a str,
    int or float, or a tuple of those (nested at most 3 deep, as the wire carries
    them); and, unlike Dask, never NaN, alone or inside a tuple: a key must equal
    itself, or no lookup would ever find its task (it would hold a thread forever)."""
    problem = key_problem(key)
    if problem is not None:
        raise TypeError(f"invalid key {key!r}: {problem}")


def key_problem(key: object) -> str | None:
    """Why ``key`` cannot be a task key, or None when it can."""
    t = type(key)
    if t is str or t is int:
        return None
    if t is float:
        return None if key == key else _NAN_KEY
    if t is tuple:
        return _tuple_key_problem(key, 3)  # type: ignore[arg-type]
    return _KEY_TYPES


_NAN_KEY = "NaN is not equal to itself, so no lookup could ever find the task"
_KEY_TYPES = "a key is a str, int or float, or a tuple of those (nested at most 3 deep), as in Dask"


def _tuple_key_problem(key: tuple, depth: int) -> str | None:
    for x in key:
        t = type(x)
        if t is str or t is int:
            continue
        if t is float:
            if x != x:
                return _NAN_KEY
        elif t is tuple:
            if depth == 1:
                return _KEY_TYPES
            problem = _tuple_key_problem(x, depth - 1)
            if problem is not None:
                return problem
        else:
            return _KEY_TYPES
    return None


def check_decoded_key(key: Key) -> None:
    """Decoding refuses a key no lookup could find (a ValidationError: the connection
    that sent it closes, naming the key). Cheap for the usual str key."""
    if type(key) is not str:
        problem = key_problem(key)
        if problem is not None:
            raise ValueError(f"invalid key {key!r}: {problem}")


# An amount of a resource ("GPU": 1, "MEM": 10e9): decoding refuses negatives and NaN.
Amount = Annotated[float, msgspec.Meta(ge=0)]


def check_resources(resources: Mapping[Any, Any]) -> dict[str, float]:
    """``resources`` as the wire carries them (names to amounts), or ValueError saying
    what is wrong: the side that sends them should fail, not the connection."""
    out = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a resource needs a name, not {name!r}")
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise ValueError(f"resource {name!r} needs a number, not {amount!r}")
        if math.isnan(amount) or amount < 0:
            raise ValueError(f"resource {name!r} cannot be {amount!r}")
        out[name] = float(amount)
    return out


class Payload(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A serialised user object. ``kind`` is MSGPACK, PICKLE, BYTES or (task arguments
    only) TEMPLATE (serialize.py);
    ``nbuffers`` out-of-band buffers follow in the frame, in message order."""

    kind: int
    data: bytes
    nbuffers: Annotated[int, msgspec.Meta(ge=0)] = 0


class Message(msgspec.Struct, tag=True, array_like=True, gc=False, omit_defaults=True):
    """Base of every wire message."""


def check_parallel(msg: Message, name: str, values: list[Any], what: str) -> None:
    """Lists that go pairwise with ``keys`` must be as long: zip would drop the rest
    silently. Raised while decoding, this is a ValidationError (a ProtocolError)."""
    keys = msg.keys  # type: ignore[attr-defined]
    if len(keys) != len(values):
        raise ValueError(
            f"{type(msg).__name__} has {len(keys)} keys but {len(values)} {what} ({name})"
        )
