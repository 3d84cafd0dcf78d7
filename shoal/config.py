"""shoal's configuration: ``dask.config`` keys under ``shoal.*``.

Defaults come from ``shoal/shoal.yaml`` (``dask.config.update_defaults``, as
``distributed.yaml``); they are overridden as any Dask config is (YAML files,
``dask.config.set``), and by ``SHOAL_*`` environment variables whose sections are
joined by ``__`` (``SHOAL_SCHEDULER__ALLOWED_FAILURES=5``), as Dask maps ``DASK_*``.
Variables without ``__`` (``SHOAL_TOKEN``, ``SHOAL_TLS_*``, ``SHOAL_*_PRELOAD``) keep
their own meaning and are no config keys.

``distributed.*`` keys that have a shoal equivalent (:data:`HONOURED`) are honoured
when set to other than Dask's default and the shoal key is left at its default; any
other ``distributed.*`` key set by the user is warned about once, never silently
ignored.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import os
import warnings
from collections.abc import Mapping
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS_FILE = os.path.join(_HERE, "shoal.yaml")
ENV_PREFIX = "SHOAL_"

# distributed.* key -> the shoal.* key it sets (a Dask user's config keeps working).
HONOURED: dict[str, str] = {
    "distributed.scheduler.allowed-failures": "scheduler.allowed-failures",
    "distributed.scheduler.worker-ttl": "scheduler.worker-ttl",
    "distributed.scheduler.locks.lease-timeout": "scheduler.locks.lease-timeout",
    "distributed.worker.memory.target": "worker.memory.target",
    "distributed.worker.memory.spill": "worker.memory.spill",
    "distributed.worker.memory.pause": "worker.memory.pause",
    "distributed.worker.memory.terminate": "worker.memory.terminate",
    "distributed.worker.memory.rebalance.sender-min": "worker.memory.rebalance.sender-min",
    "distributed.worker.memory.rebalance.recipient-max": "worker.memory.rebalance.recipient-max",
    "distributed.worker.memory.rebalance.sender-recipient-gap": (
        "worker.memory.rebalance.sender-recipient-gap"
    ),
    "distributed.comm.timeouts.connect": "comm.timeouts.connect",
    "distributed.comm.timeouts.tcp": "comm.timeouts.scheduler",
}
DURATIONS = {
    "scheduler.worker-ttl",
    "scheduler.handshake-timeout",
    "worker.timeout",
    "worker.interrupt-grace",
    "worker.transfer.buffer-pool-idle",
    "comm.timeouts.connect",
    "comm.timeouts.scheduler",
}

with open(DEFAULTS_FILE) as _f:
    DEFAULTS: dict[str, Any] = yaml.safe_load(_f)
_warned: set[str] = set()


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{str(key).replace('_', '-')}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


_SHOAL_DEFAULTS = _flatten(DEFAULTS["shoal"])


def collect_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``SHOAL_A__B_C=value`` -> ``{"shoal": {"a": {"b-c": value}}}`` (values parsed as
    Python literals when they are one, as Dask does), for variables with ``__`` only."""
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        parts = [p.lower().replace("_", "-") for p in name[len(ENV_PREFIX) :].split("__")]
        try:
            value: Any = ast.literal_eval(raw)
        except (SyntaxError, ValueError):
            value = raw
        node = out.setdefault("shoal", {})
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def load() -> None:
    """Put shoal's defaults into ``dask.config`` and apply ``SHOAL_*`` variables (at
    import: every shoal process, and each child it starts with this environment)."""
    dask.config.update_defaults(DEFAULTS)
    env = collect_env()
    if env:
        dask.config.update(dask.config.config, env, priority="new")


def _distributed_defaults() -> dict[str, Any]:
    """Dask distributed's own defaults (read from its YAML, without importing it)."""
    spec = importlib.util.find_spec("distributed")
    if spec is None or spec.origin is None:
        return {}
    path = os.path.join(os.path.dirname(spec.origin), "distributed.yaml")
    try:
        with open(path) as f:
            return _flatten(yaml.safe_load(f))
    except OSError:
        return {}


_dist_defaults: dict[str, Any] | None = None
# (a copy of the ``distributed`` config tree, the keys found in it): with distributed
# imported its tree has hundreds of keys, and flattening it on every ``get`` cost
# ~0.7 ms, twice per compute on the client. A tree equal to the copy (one C-level
# comparison) has the same keys.
_user_keys_cache: tuple[Any, dict[str, Any]] | None = None


def user_distributed_keys() -> dict[str, Any]:
    """The ``distributed.*`` keys whose value differs from Dask's default (set by the
    user), flattened."""
    global _dist_defaults, _user_keys_cache
    tree = dask.config.config.get("distributed", {})
    cached = _user_keys_cache
    if cached is not None:
        try:
            if cached[0] == tree:
                return dict(cached[1])
        except Exception:  # a value that does not compare (e.g. an array): scan again
            pass
    if _dist_defaults is None:
        _dist_defaults = _distributed_defaults()
    current = _flatten({"distributed": tree}) if isinstance(tree, Mapping) else {}
    missing = object()
    found = {k: v for k, v in current.items() if _dist_defaults.get(k, missing) != v}
    try:
        _user_keys_cache = (copy.deepcopy(tree), found)
    except Exception:  # a value that does not copy: no cache
        _user_keys_cache = None
    return dict(found)


def warn_unhonoured() -> None:
    """Warn once per key about ``distributed.*`` keys set that shoal does not honour."""
    for key in sorted(user_distributed_keys()):
        if key not in HONOURED and key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"dask config {key!r} is set, but shoal has no equivalent and ignores it "
                "(honoured: " + ", ".join(sorted(HONOURED)) + "; shoal's own keys are "
                "under 'shoal.', see the README)",
                UserWarning,
                stacklevel=3,
            )


def get(key: str) -> Any:
    """The value of ``shoal.<key>``: as configured; a ``distributed.*`` equivalent the
    user set counts when the shoal key is at its default. Durations in seconds."""
    if key not in _SHOAL_DEFAULTS:
        raise KeyError(f"no shoal config key {key!r} (known: {sorted(_SHOAL_DEFAULTS)})")
    warn_unhonoured()
    value = dask.config.get(f"shoal.{key}")
    if value == _SHOAL_DEFAULTS[key]:
        user = user_distributed_keys()
        for dist_key, shoal_key in HONOURED.items():
            if shoal_key == key and dist_key in user:
                value = user[dist_key]
    if key in DURATIONS and value is not None:
        value = parse_timedelta(value, default="seconds")
    if key.startswith("worker.memory.") and key != "worker.memory.limit" and value is False:
        value = None  # a fraction turned off, as Dask's false
    return value


class ConfigDefault:
    """A CLI option's ``default=``: ``shoal.<key>`` when the command runs (click calls
    it), shown in ``--help`` as the value and its key."""

    def __init__(self, key: str, convert: Any = None):
        if key not in _SHOAL_DEFAULTS:
            raise KeyError(f"no shoal config key {key!r}")
        self.key = key
        self.convert = convert

    def __call__(self) -> Any:
        value = get(self.key)
        return self.convert(value) if self.convert is not None else value

    def __str__(self) -> str:
        return f"{self()}, config shoal.{self.key}"


def fraction_text(value: float | None) -> str:
    """A memory fraction as the CLI takes it ("off" for none)."""
    return "off" if value is None else str(value)


def optional_text(value: Any) -> str | None:
    return None if value is None else str(value)


class _Configured:
    """The default of a parameter whose value comes from the config when not given."""

    def __repr__(self) -> str:
        return "<from shoal config>"


CONFIGURED: Any = _Configured()


def resolve(value: Any, key: str) -> Any:
    """``value``, or ``shoal.<key>`` when it was left at :data:`CONFIGURED`."""
    return get(key) if value is CONFIGURED else value


load()
