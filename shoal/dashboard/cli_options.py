"""Command-line options of the HTTP ports (``shoal scheduler`` / ``shoal worker``):
``--metrics-address``, ``--metrics-token``, and checking an HTTP address option."""

from __future__ import annotations

from typing import Any

import click

from shoal.config import ConfigDefault as cfg


def metrics_options(command: Any) -> Any:
    """``--metrics-address`` and ``--metrics-token`` (shoal/dashboard/serve_metrics.py)."""
    options = [
        click.option(
            "--metrics-address",
            default=None,
            help="Also serve Prometheus /metrics alone here ([host]:port, e.g. "
            "10.0.0.1:9100; :0 any free port), for a Prometheus server.",
        ),
        click.option(
            "--metrics-token",
            envvar="SHOAL_METRICS_TOKEN",
            default=cfg("metrics.token"),
            help="Bearer token /metrics asks for (Authorization: Bearer ...); default: "
            "the SHOAL_METRICS_TOKEN variable or config shoal.metrics.token.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def http_option(value: str | None, option: str) -> str | None:
    """An HTTP address option checked (a usage error naming the option if bad)."""
    if value is None:
        return None
    from shoal.dashboard.http import parse_http_address

    try:
        parse_http_address(value, "")
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=option) from None
    return value


def worker_http_args(http: dict[str, Any]) -> list[str]:
    """The HTTP options as arguments for a worker under a nanny (the token is not
    among them: it reaches the worker in SHOAL_METRICS_TOKEN, not on a command line)."""
    dashboard, metrics = http["dashboard_address"], http["metrics_address"]
    return [
        *(["--dashboard-address", dashboard] if dashboard is not None else ["--no-dashboard"]),
        *(["--metrics-address", metrics] if metrics is not None else []),
    ]
