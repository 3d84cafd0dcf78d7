"""The performance report as one self-contained HTML file: the report's data as JSON
inside the page, and the package's own script and style sheet inlined
(``static/performance_report.{js,css}``): it opens offline, from a mail attachment.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<header><h1>{title}</h1><div class="sub">{subtitle}</div></header>
<main>
<section><h2>Summary</h2><div id="summary"></div></section>
<section><h2>Task stream</h2><div id="task-stream"></div></section>
<section><h2>Task prefixes</h2><div id="prefixes"></div></section>
<section><h2>Transfers between workers</h2><div id="transfers"></div></section>
<section><h2>Worker memory</h2><div id="memory"></div></section>
<section><h2>Code</h2><pre id="code">{code}</pre></section>
</main>
<script id="report-data" type="application/json">{data}</script>
<script>
{js}
</script>
</body>
</html>
"""


def _static(name: str) -> str:
    return resources.files("shoal.dashboard").joinpath("static", name).read_text("utf-8")


def render_report(report: dict[str, Any]) -> str:
    """The HTML page of ``report`` (see ``shoal.client.performance_report``)."""
    # "<" escaped inside the JSON: no "</script>" in a key or a path can end the block
    data = json.dumps(report, default=str).replace("<", "\\u003c")
    summary = report["summary"]
    return _TEMPLATE.format(
        title="shoal performance report",
        subtitle=html.escape(
            f"{summary['started']} · {summary['duration']:.2f} s · {summary['scheduler']}"
        ),
        css=_static("performance_report.css"),
        js=_static("performance_report.js"),
        code=html.escape(report.get("code", "")),
        data=data,
    )
