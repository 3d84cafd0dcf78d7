"""The dashboard's URL as users open it: a template (``SHOAL_DASHBOARD_LINK`` or the
config ``shoal.dashboard.link``) formatted with ``host``, ``port``, ``scheme`` and the
environment's variables, as Dask's ``distributed.dashboard.link`` (behind JupyterHub:
``/user/{JUPYTERHUB_USER}/proxy/{port}/status``). With a cluster token the link is a
one-time login link to the same page (``auth.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from urllib.parse import urlencode

from shoal.dashboard.auth import LOGIN_LINK_TTL, login_query

ENV_LINK = "SHOAL_DASHBOARD_LINK"


def link_template() -> str:
    template = os.environ.get(ENV_LINK)
    if template:
        return template
    from shoal import config

    return str(config.get("dashboard.link"))


def format_link(
    host: str,
    port: int,
    template: str | None = None,
    environ: Mapping[str, str] | None = None,
    scheme: str = "http",
) -> str:
    """The template formatted; a name it uses that is not known is a clear error."""
    template = link_template() if template is None else template
    values = {**(os.environ if environ is None else environ)}
    if ":" in host and not host.startswith("["):  # an IPv6 address in a URL
        host = f"[{host}]"
    values.update(host=host, port=str(port), scheme=scheme)
    try:
        return template.format(**values)
    except KeyError as e:
        raise ValueError(
            f"the dashboard link template {template!r} uses {{{e.args[0]}}}, which is "
            "neither host, port, scheme nor an environment variable"
        ) from None


def login_link(url: str, token: str, now: float | None = None, ttl: float = LOGIN_LINK_TTL) -> str:
    """A one-time login link that opens the page ``url`` names (its last path part)."""
    base, _, page = url.partition("?")[0].rpartition("/")
    query = login_query(token, time.time() if now is None else now, ttl)
    return f"{base}/login?{urlencode({**query, 'next': page or 'status'})}"


def dashboard_link(
    host: str, port: int, token: str | None = None, template: str | None = None
) -> str:
    """What ``client.dashboard_link`` gives: the page, or a one-time link to it."""
    url = format_link(host, port, template)
    return login_link(url, token) if token else url


def parse_address(text: str | int, default_host: str) -> tuple[str, int]:
    """``":8787"``, ``"8787"``, ``"0.0.0.0:8787"``, ``"[::1]:0"`` -> (host, port); no
    host: ``default_host`` (the scheduler's)."""
    raw = str(text).strip()
    if raw.startswith(("http://", "https://")):
        raw = raw.split("://", 1)[1].rstrip("/")
    host, sep, port_text = raw.rpartition(":")
    if not sep:
        host, port_text = "", raw
    if host.count(":") and not host.startswith("["):
        raise ValueError(f"dashboard address {text!r}: write an IPv6 host in brackets, [::1]:8787")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(
            f"dashboard address {text!r} has no port number (e.g. ':8787' or '127.0.0.1:0')"
        ) from None
    if not 0 <= port < 65536:
        raise ValueError(f"dashboard address {text!r}: port {port} is out of range")
    return host.strip("[]") or default_host, port
