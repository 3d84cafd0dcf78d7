"""HTTP: Prometheus ``/metrics``, the workers' HTTP ports, performance reports (and the
scheduler's dashboard). aiohttp is imported only by the modules that open a port."""
