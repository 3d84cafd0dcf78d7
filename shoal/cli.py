"""Command line: ``shoal scheduler`` and ``shoal worker``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from shoal.client.loop import run
from shoal.config import ConfigDefault as cfg
from shoal.config import fraction_text, optional_text
from shoal.dashboard.cli_options import http_option, metrics_options, worker_http_args
from shoal.protocol.exit_codes import EXIT_RESTART
from shoal.protocol.messages import check_resources

if TYPE_CHECKING:
    from shoal.server.worker import Worker

# A worker's threads are its parallelism. Numerical libraries that start a thread per
# core of their own oversubscribe the machine: two workers whose BLAS calls each spin
# two threads on two cores wait on each other (a 100x100 matmul chunk took 7 ms instead
# of 0.1). As Dask's nanny does, a worker runs them single-threaded unless the user's
# environment says otherwise.
LIBRARY_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


def _stop_on_signals(stop: Any) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


async def _watch_pid(pid: int, stop: Any, interval: float = 1.0) -> None:
    """Stop when the process that started us is gone (LocalCluster's owner, a nanny).
    Our parent is watched by its pid being our parent's: no mistake on a reused pid."""
    import psutil

    if pid == os.getppid():
        while os.getppid() == pid:
            await asyncio.sleep(interval)
    else:
        while psutil.pid_exists(pid):
            await asyncio.sleep(interval)
    stop()


def parse_resources(text: str) -> dict[str, float]:
    """``"GPU=2,MEM=10e9"`` (the command line's form) -> ``{"GPU": 2.0, "MEM": 1e10}``."""
    out: dict[str, Any] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, amount = item.partition("=")
        try:
            out[name.strip()] = float(amount) if sep else None
        except ValueError:
            out[name.strip()] = amount.strip()
    return check_resources(out)


def security_options(command: Any) -> Any:
    """The options for a cluster token and TLS; each falls back to its SHOAL_* variable."""
    options = [
        click.option(
            "--token",
            envvar="SHOAL_TOKEN",
            help="Cluster token every connection must prove (prefer the SHOAL_TOKEN "
            "variable: a command line is visible to every user of the machine).",
        ),
        click.option(
            "--tls-ca-file",
            envvar="SHOAL_TLS_CA_FILE",
            type=click.Path(exists=True, dir_okay=False),
            help="CA certificate (PEM) that signed every member's certificate.",
        ),
        click.option(
            "--tls-cert",
            envvar="SHOAL_TLS_CERT",
            type=click.Path(exists=True, dir_okay=False),
            help="This process's certificate (PEM; may hold the key too).",
        ),
        click.option(
            "--tls-key",
            envvar="SHOAL_TLS_KEY",
            type=click.Path(exists=True, dir_okay=False),
            help="This process's private key (PEM).",
        ),
        click.option(
            "--require-encryption",
            envvar="SHOAL_REQUIRE_ENCRYPTION",
            is_flag=True,
            help="Refuse plain tcp:// (needs the TLS options).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def make_security(options: dict[str, Any]) -> Any:
    """A Security from the ``security_options`` (popped from ``options``)."""
    from shoal.comm.security import Security

    try:
        return Security(
            token=options.pop("token") or None,
            tls_ca_file=options.pop("tls_ca_file"),
            tls_cert=options.pop("tls_cert"),
            tls_key=options.pop("tls_key"),
            require_encryption=options.pop("require_encryption"),
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from None


@click.group()
def main() -> None:
    """shoal: a distributed task scheduler for Python."""


@main.command()
@click.option(
    "--host",
    default=cfg("scheduler.host"),
    show_default=True,
    help="Address to listen on (0.0.0.0: every interface, advertising this host's address).",
)
@click.option(
    "--port",
    default=cfg("scheduler.port"),
    show_default=True,
    help="Port to listen on (0: any free).",
)
@click.option("--scheduler-file", type=click.Path(dir_okay=False), help="Write the address here.")
@click.option("--validate", is_flag=True, help="Check every invariant after each event (slow).")
@click.option("--watch-pid", type=int, help="Exit when this process exits.")
@click.option("--log-level", default=cfg("scheduler.log-level"), show_default=True)
@click.option("--quiet", is_flag=True, help="Do not print the address.")
@click.option(
    "--allowed-failures",
    type=int,
    default=cfg("scheduler.allowed-failures"),
    show_default=True,
    help="Worker deaths a task may be present at before it errs with KilledWorker.",
)
@click.option(
    "--worker-ttl",
    type=float,
    default=cfg("scheduler.worker-ttl"),
    show_default=True,
    help="Seconds without a heartbeat before a worker is removed (at least 4 heartbeats).",
)
@click.option(
    "--preload",
    multiple=True,
    envvar="SHOAL_SCHEDULER_PRELOAD",
    help="A module (dotted name, or path.py) to import; its shoal_setup(server) runs once "
    "the server does, shoal_teardown(server) once it closed (Dask's dask_setup too). "
    "Repeatable; default: the SHOAL_SCHEDULER_PRELOAD variable (space-separated).",
)
@click.option(
    "--handshake-timeout",
    type=float,
    default=cfg("scheduler.handshake-timeout"),
    show_default=True,
    help="Seconds a new connection has to send a complete Hello before it is closed.",
)
@click.option(
    "--work-stealing/--no-work-stealing",
    default=True,
    show_default=True,
    help="Move queued tasks from busy workers to idle ones.",
)
@click.option(
    "--dashboard-address",
    default=cfg("scheduler.dashboard.address"),
    show_default=True,
    help="Where the web dashboard listens: [host]:port (no host: --host's; port 0: any "
    "free; a port in use: another, with a warning).",
)
@click.option(
    "--dashboard/--no-dashboard",
    default=cfg("scheduler.dashboard.enabled"),
    show_default=True,
    help="Serve the web dashboard.",
)
@security_options
@metrics_options
def scheduler(
    host: str,
    port: int,
    scheduler_file: str | None,
    validate: bool,
    quiet: bool,
    watch_pid: int | None,
    log_level: str,
    allowed_failures: int,
    worker_ttl: float,
    handshake_timeout: float,
    preload: tuple[str, ...],
    work_stealing: bool,
    metrics_address: str | None,
    metrics_token: str | None,
    dashboard_address: str,
    dashboard: bool,
    **options: Any,
) -> None:
    """Start a scheduler and print its address (and its dashboard's URL)."""
    from shoal.server.scheduler import Scheduler

    _setup_logging(log_level)
    if allowed_failures < 0:
        raise click.BadParameter("cannot be negative", param_hint="--allowed-failures")
    if worker_ttl <= 0:
        raise click.BadParameter("must be positive", param_hint="--worker-ttl")
    if handshake_timeout <= 0:
        raise click.BadParameter("must be positive", param_hint="--handshake-timeout")
    security = make_security(options)
    preloads = _import_preloads(preload)
    if dashboard:
        from shoal.dashboard.links import parse_address

        try:
            parse_address(dashboard_address, host)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--dashboard-address") from None

    async def serve() -> None:
        s = Scheduler(
            host,
            port,
            validate=validate,
            owns_process=True,
            allowed_failures=allowed_failures,
            worker_ttl=worker_ttl,
            security=security,
            handshake_timeout=handshake_timeout,
            work_stealing=work_stealing,
            metrics_address=http_option(metrics_address, "--metrics-address"),
            metrics_token=metrics_token or None,
            dashboard_address=dashboard_address if dashboard else None,
        )
        try:
            await s.start()
        except OSError as e:  # a port taken
            raise click.ClickException(str(e)) from None
        try:
            await _setup_preloads(preloads, s)
        except click.ClickException:
            await s.close()
            raise
        stop = lambda: asyncio.ensure_future(s.close())  # noqa: E731
        _stop_on_signals(stop)
        if scheduler_file:
            s.write_scheduler_file(scheduler_file)
        if watch_pid:
            asyncio.ensure_future(_watch_pid(watch_pid, stop))
        if not quiet:
            click.echo(f"shoal scheduler at {s.address}", err=True)
            if s.metrics_url:
                click.echo(f"shoal scheduler metrics at {s.metrics_url}/metrics", err=True)
            if s.dashboard_port:
                from shoal.core.scheduler.model import parse_host
                from shoal.dashboard.links import format_link

                url = format_link(parse_host(s.address), s.dashboard_port)
                needs = " (needs the token: open client.dashboard_link)" if s.security.token else ""
                click.echo(f"shoal dashboard at {url}{needs}", err=True)
            click.echo(s.address)
        await s.finished()
        await preloads.teardown(s)

    run(serve())


def _read_scheduler_file(path: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                return str(json.load(f)["address"])
        except (FileNotFoundError, json.JSONDecodeError):
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"no scheduler file at {path} after {timeout}s"
                ) from None
            time.sleep(0.05)


@main.command()
@click.argument("address", required=False)
@click.option("--scheduler-file", type=click.Path(dir_okay=False), help="Read the address here.")
@click.option(
    "--nthreads",
    type=int,
    default=cfg("worker.nthreads"),
    show_default=True,
    help="Threads that run tasks.",
)
@click.option("--name", default="", help="A name for this worker.")
@click.option(
    "--host",
    default=cfg("worker.host"),
    help="Address to listen on and advertise (default: this host's side of the route to "
    "the scheduler; 0.0.0.0: every interface).",
)
@click.option(
    "--port",
    type=int,
    default=cfg("worker.port"),
    show_default=True,
    help="Port for peers (0: any free).",
)
@click.option("--interface", default=None, help="Listen on this network interface (eth0, ...).")
@click.option(
    "--listen-address",
    default=None,
    help="Bind exactly here, e.g. tcp://0.0.0.0:8000 (containers).",
)
@click.option(
    "--contact-address",
    default=None,
    help="Advertise this address to the scheduler and peers (NAT, port forwarding).",
)
@click.option(
    "--nanny/--no-nanny",
    default=cfg("worker.nanny"),
    show_default=True,
    help="Run the worker under a nanny process that restarts it when it dies.",
)
@click.option(
    "--memory-limit",
    default=cfg("worker.memory.limit", str),
    show_default=True,
    help='Bytes ("4GiB", "200MB", "2e9"), a fraction of this machine ("0.5"), "auto" '
    '(the machine shared by threads) or "none".',
)
@click.option(
    "--memory-target-fraction",
    default=cfg("worker.memory.target", fraction_text),
    show_default=True,
    help='Results in memory past this much of the limit go to disk ("off": never).',
)
@click.option(
    "--memory-spill-fraction",
    default=cfg("worker.memory.spill", fraction_text),
    show_default=True,
    help="Process memory past this much of the limit: results go to disk.",
)
@click.option(
    "--memory-pause-fraction",
    default=cfg("worker.memory.pause", fraction_text),
    show_default=True,
    help="Process memory past this much of the limit: start no task until it falls.",
)
@click.option(
    "--memory-terminate-fraction",
    default=cfg("worker.memory.terminate", fraction_text),
    show_default=True,
    help="Process memory past this much of the limit: the nanny restarts the worker.",
)
@click.option("--local-directory", default=None, help="For spill files (default: temp dir).")
@click.option("--watch-pid", type=int, help="Exit when this process exits.")
@click.option("--address-file", hidden=True, help="Write the worker's address here (nanny).")
@click.option(
    "--restart-file",
    hidden=True,
    help="Under a nanny: exiting to be restarted, write why here (and exit with EXIT_RESTART).",
)
@click.option("--zero", is_flag=True, help="Report every task done at once (benchmarks).")
@click.option("--validate", is_flag=True, help="Check every invariant after each event (slow).")
@click.option(
    "--resources",
    default="",
    help='What tasks may ask for, e.g. "GPU=2,MEM=10e9" (Client.submit(resources=...)).',
)
@click.option(
    "--timeout",
    type=float,
    default=cfg("worker.timeout"),
    show_default=True,
    help="Seconds to wait for the scheduler.",
)
@click.option(
    "--scheduler-timeout",
    type=float,
    default=cfg("comm.timeouts.scheduler"),
    show_default=True,
    help="Seconds without an answer to a heartbeat before the scheduler counts as gone.",
)
@click.option(
    "--reconnect/--no-reconnect",
    default=cfg("worker.reconnect"),
    show_default=True,
    help="When the scheduler is gone, wait (up to --timeout) and join it again, "
    "empty, instead of exiting.",
)
@click.option(
    "--interrupt-grace",
    type=float,
    default=cfg("worker.interrupt-grace"),
    show_default=True,
    help="Seconds a force-cancelled task has to stop once interrupted; then the worker "
    "restarts through its nanny.",
)
@click.option(
    "--preload",
    multiple=True,
    envvar="SHOAL_WORKER_PRELOAD",
    help="A module (dotted name, or path.py) to import; its shoal_setup(server) runs once "
    "the server does, shoal_teardown(server) once it closed (Dask's dask_setup too). "
    "Repeatable; default: the SHOAL_WORKER_PRELOAD variable (space-separated).",
)
@click.option(
    "--lifetime",
    default=cfg("worker.lifetime", optional_text),
    help='Leave after this long ("55m", "4h", seconds), gracefully: no new task, running '
    "ones finish, results handed to other workers. The scheduler starts no task here "
    "that would not finish in time.",
)
@click.option(
    "--lifetime-stagger",
    default=cfg("worker.lifetime-stagger", str),
    show_default=True,
    help="Spread --lifetime by a random +-this much, so workers started together do not "
    "all leave at once.",
)
@click.option(
    "--lifetime-restart/--no-lifetime-restart",
    default=cfg("worker.lifetime-restart"),
    show_default=True,
    help="At the end of --lifetime or --max-tasks, have the nanny start a fresh worker "
    "under the same name (needs --nanny); else exit.",
)
@click.option(
    "--max-tasks",
    default=cfg("worker.max-tasks", optional_text),
    help="Run at most this many tasks, then leave as at the end of --lifetime.",
)
@click.option(
    "--dashboard-address",
    default=cfg("worker.dashboard-address"),
    show_default=True,
    help="HTTP port with /metrics and /health ([host]:port; :0 any free port on the "
    "worker's host); told to the scheduler (scheduler_info: http_address).",
)
@click.option("--no-dashboard", is_flag=True, help="Open no HTTP port.")
@click.option("--log-level", default=cfg("worker.log-level"), show_default=True)
@security_options
@metrics_options
def worker(
    address: str | None,
    scheduler_file: str | None,
    nthreads: int,
    name: str,
    host: str | None,
    port: int,
    interface: str | None,
    listen_address: str | None,
    contact_address: str | None,
    nanny: bool,
    memory_limit: str,
    memory_target_fraction: str,
    memory_spill_fraction: str,
    memory_pause_fraction: str,
    memory_terminate_fraction: str,
    local_directory: str | None,
    watch_pid: int | None,
    address_file: str | None,
    restart_file: str | None,
    zero: bool,
    validate: bool,
    resources: str,
    timeout: float,
    scheduler_timeout: float,
    reconnect: bool,
    interrupt_grace: float,
    preload: tuple[str, ...],
    lifetime: str | None,
    lifetime_stagger: str,
    lifetime_restart: bool,
    max_tasks: str | None,
    dashboard_address: str | None,
    no_dashboard: bool,
    metrics_address: str | None,
    metrics_token: str | None,
    log_level: str,
    **options: Any,
) -> None:
    """Start a worker for the scheduler at ADDRESS (or the one in --scheduler-file)."""
    for variable in LIBRARY_THREADS:  # read by numpy's BLAS when first imported, below
        os.environ.setdefault(variable, "1")
    from shoal.server.memory import MemoryFractions, parse_fraction, parse_memory_limit
    from shoal.server.worker import Worker

    _setup_logging(log_level)
    security = make_security(options)
    if address is None:
        if scheduler_file is None:
            raise click.UsageError("give the scheduler's ADDRESS or --scheduler-file")
        address = _read_scheduler_file(scheduler_file, timeout)
    if nthreads < 1:
        raise click.BadParameter(f"must be at least 1, not {nthreads}", param_hint="--nthreads")
    addresses = _worker_addresses(host, port, interface, listen_address, contact_address)
    try:
        amounts = parse_resources(resources)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--resources") from None
    try:
        limit = parse_memory_limit(memory_limit, nthreads)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--memory-limit") from None
    fraction_options = {
        "--memory-target-fraction": memory_target_fraction,
        "--memory-spill-fraction": memory_spill_fraction,
        "--memory-pause-fraction": memory_pause_fraction,
        "--memory-terminate-fraction": memory_terminate_fraction,
    }
    try:
        fractions = MemoryFractions(*map(parse_fraction, fraction_options.values()))
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if limit is None:  # no limit: no thresholds
        fractions = MemoryFractions(None, None, None, None)
    walltime = _walltime_options(lifetime, lifetime_stagger, max_tasks)
    name = name or f"{os.uname().nodename}-{os.getpid()}"
    http: dict[str, Any] = {
        "dashboard_address": None
        if no_dashboard or dashboard_address is None
        else http_option(dashboard_address, "--dashboard-address"),
        "metrics_address": http_option(metrics_address, "--metrics-address"),
        "metrics_token": metrics_token or None,  # the nanny's worker gets it by environment
    }
    if nanny:
        passed = [
            *("--nthreads", str(nthreads)),
            *addresses,
            *[arg for option, value in fraction_options.items() for arg in (option, value)],
            *(["--zero"] if zero else []),
            *(["--validate"] if validate else []),
            *(["--resources", resources] if resources else []),
            *("--log-level", log_level),
            *("--scheduler-timeout", str(scheduler_timeout)),
            *(["--reconnect"] if reconnect else []),
            *("--interrupt-grace", str(interrupt_grace)),
            *[arg for module in preload for arg in ("--preload", module)],
            *(["--lifetime", lifetime] if lifetime is not None else []),
            *("--lifetime-stagger", lifetime_stagger),
            *(["--lifetime-restart"] if lifetime_restart else []),
            *(["--max-tasks", max_tasks] if max_tasks is not None else []),
            *worker_http_args(http),
        ]
        if metrics_token:  # the worker it starts inherits this process's environment
            os.environ["SHOAL_METRICS_TOKEN"] = metrics_token
        _run_nanny(
            address, name, passed, limit, fractions.terminate, local_directory, timeout, security
        )
        return

    log = logging.getLogger("shoal.worker")
    preloads = _import_preloads(preload)
    # Arrow buffers (pyarrow-backed strings, shuffles) from the C library's allocator,
    # which gives freed memory back, rather than mimalloc, which keeps it: a worker's
    # RSS is what its memory limit and the memory monitor act on. Yours wins if set.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

    def make_worker() -> Worker:
        return Worker(
            address,
            nthreads,
            name=name,
            host=host,
            port=port,
            interface=interface,
            listen_address=listen_address,
            contact_address=contact_address,
            memory_limit=limit,
            zero=zero,
            validate=validate,
            owns_process=True,
            resources=amounts,
            scheduler_timeout=scheduler_timeout,
            security=security,
            memory_fractions=fractions,
            local_directory=local_directory,
            under_nanny=restart_file is not None,
            interrupt_grace=interrupt_grace,
            lifetime_restart=lifetime_restart,
            **walltime,
            **http,
        )

    exit_code = 0

    async def serve() -> None:
        nonlocal exit_code
        current: list[Worker] = []
        stopping = asyncio.Event()

        def stop() -> None:  # SIGINT, or our nanny is gone: close now
            stopping.set()
            for w in current:
                asyncio.ensure_future(w.close("stopped"))

        def terminate() -> None:  # SIGTERM: leave gracefully (under a nanny: to restart)
            if not current:
                stop()
            for w in current:
                w.on_sigterm()

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop)
        loop.add_signal_handler(signal.SIGTERM, terminate)
        watching = None  # a reference, so the task is not collected while it runs
        if watch_pid:  # our nanny: never outlive it
            watching = asyncio.ensure_future(_watch_pid(watch_pid, stop, interval=0.2))
        while not stopping.is_set():
            w = await _start_worker(make_worker, timeout, stopping)
            if w is None:
                return
            current[:] = [w]
            if stopping.is_set():  # asked to stop while it was starting
                await w.close("stopped")
                return
            try:
                await _setup_preloads(preloads, w)
            except click.ClickException:
                await w.close("its preload failed")
                raise
            if address_file:
                _write_atomically(address_file, w.address)
            log.info("shoal worker at %s", w.address)
            await w.finished()
            await preloads.teardown(w)
            if w.restart and restart_file:
                _write_atomically(restart_file, w.leaving or w.close_reason)
                exit_code = EXIT_RESTART
                return
            if w.leaving or not (reconnect and w.close_reason.startswith("lost the scheduler")):
                return
            log.warning("%s; joining it again when it is back", w.close_reason)
        del watching

    run(serve())
    if exit_code:
        raise SystemExit(exit_code)


def _worker_addresses(
    host: str | None,
    port: int,
    interface: str | None,
    listen_address: str | None,
    contact_address: str | None,
) -> list[str]:
    """The address options checked (a usage error naming them if they contradict each
    other), as arguments to pass on to a worker under a nanny."""
    from shoal.comm.addresses import WorkerAddressOptions

    try:
        WorkerAddressOptions(host, port, interface, listen_address, contact_address).check()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    options = {
        "--host": host,
        "--port": str(port) if port else None,
        "--interface": interface,
        "--listen-address": listen_address,
        "--contact-address": contact_address,
    }
    return [
        arg for option, value in options.items() if value is not None for arg in (option, value)
    ]


def _walltime_options(lifetime: str | None, stagger: str, max_tasks: str | None) -> dict[str, Any]:
    """The Worker arguments of --lifetime, --lifetime-stagger and --max-tasks; a bad
    value is a usage error naming its option."""
    from shoal._durations import parse_duration, parse_task_budget

    try:
        return {
            "lifetime": None if lifetime is None else parse_duration(lifetime, "--lifetime"),
            "lifetime_stagger": parse_duration(stagger, "--lifetime-stagger", allow_zero=True),
            "max_tasks": None if max_tasks is None else parse_task_budget(max_tasks, "--max-tasks"),
        }
    except ValueError as e:
        raise click.UsageError(str(e)) from None


async def _start_worker(
    make: Callable[[], Worker], timeout: float, stopping: asyncio.Event
) -> Worker | None:
    """A started worker; tries again (a new one each time) while the scheduler is not
    listening yet, for up to ``timeout`` seconds. None: asked to stop meanwhile."""
    from shoal.comm.tcp import HandshakeError

    deadline = time.monotonic() + timeout
    while not stopping.is_set():
        w = make()
        try:
            return await w.start()
        except (HandshakeError, ValueError) as e:  # refused or misconfigured: final
            await w.close()
            raise click.ClickException(str(e)) from None
        except OSError as e:  # the scheduler may not be listening (yet, or again)
            await w.close()
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"no scheduler at {w.scheduler_address} within {timeout:g}s (--timeout): {e}"
                ) from None
            await asyncio.sleep(0.2)
    return None


def _run_nanny(
    address: str,
    name: str,
    worker_args: list[str],
    memory_limit: int | None,
    terminate: float | None,
    local_directory: str | None,
    timeout: float,
    security: Any,
) -> None:
    from shoal.server.nanny import Nanny, SchedulerUnreachable

    async def supervise() -> int:
        nanny = Nanny(
            address,
            name,
            worker_args,
            memory_limit=memory_limit,
            terminate_fraction=terminate,
            local_directory=local_directory,
            timeout=timeout,
            security=security,
        )
        _stop_on_signals(nanny.stop)
        return await nanny.run()

    try:
        code = run(supervise())
    except SchedulerUnreachable as e:
        raise click.ClickException(str(e)) from None
    if code:
        raise SystemExit(code)


def _import_preloads(specs: tuple[str, ...]) -> Any:
    from shoal.plugins.preload import PreloadError, Preloads

    try:
        return Preloads(specs)
    except PreloadError as e:
        raise click.ClickException(str(e)) from None


async def _setup_preloads(preloads: Any, server: Any) -> None:
    from shoal.plugins.preload import PreloadError

    try:
        await preloads.setup(server)
    except PreloadError as e:
        raise click.ClickException(str(e)) from None


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
