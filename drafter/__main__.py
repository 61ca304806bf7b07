"""`python -m drafter [flags]` (and `drafter-serve`, `./serve.sh`): one Hypercorn worker serving the app.

One process, one model: the engine is loaded once, in the background, while Hypercorn already answers the
health probes. SIGTERM/SIGINT drain first (readiness 503, in-flight requests finish), then Hypercorn stops.
A bad flag, variable or model path, or a port already taken, ends with one error line and exit status 2;
an engine that fails to load or warm up ends the process with status 1.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from drafter.server.cli import UsageError, config_from_args
from drafter.server.config import ServerConfig

log = logging.getLogger("drafter")

KEEP_ALIVE_S = (
    75  # longer than the idle timeout of common client pools, so the target's connections stay warm
)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        config = config_from_args(argv)
        check_model_source(config.model)
        check_address(config.host, config.port)
        if config.uds is not None:
            check_socket_path(config.uds)
    except ValueError as error:  # UsageError, ServerConfigError, ConfigError and LoadError alike
        log.error("%s", error if isinstance(error, UsageError) else f"bad configuration: {error}")
        return 2
    logging.getLogger().setLevel(config.log_level_number)
    log.info("starting with %s", config)
    return asyncio.run(serve(config))


def check_model_source(source: str) -> None:
    """Fail fast on a model directory that cannot be served, before the server starts."""
    from engine.model.config import ConfigError, ModelConfig
    from engine.model.errors import LoadError
    from engine.model.loader import checkpoint_files, read_hf_config
    from engine.model.presets import PRESETS, is_preset

    if is_preset(source):
        return
    directory = Path(source)
    if not directory.is_dir():
        raise UsageError(
            f"--model {source!r} is neither a preset ({', '.join(PRESETS)}) nor a directory; "
            "a hub id such as Qwen/Qwen3-0.6B is exported first: "
            "python -m export Qwen/Qwen3-0.6B DIR, then --model DIR"
        )
    try:
        ModelConfig.from_hf(read_hf_config(directory))
    except ConfigError as error:
        raise LoadError(f"{directory}: {error}") from None
    checkpoint_files(directory)


def check_address(host: str, port: int) -> None:
    """Fail in one line on an address that cannot be bound, before the engine starts loading (Hypercorn
    would bind only after startup, and fail with a long traceback)."""
    if port == 0:
        return
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise UsageError(f"--host {host!r} cannot be resolved: {error.strerror}") from None
    family, kind, proto, _, address = addresses[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Hypercorn binds
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"port {port} on {host} is already in use (another drafter?): stop that process, "
                    "or pick another port with --port or DRAFTER_PORT"
                ) from None
            raise UsageError(f"cannot listen on {host}:{port}: {error.strerror}") from None


def check_socket_path(path: str) -> None:
    """A Unix socket path we may bind: free, or a stale socket left by a server that died (removed here).
    A live server's socket, or a file that is not a socket, is refused in one line."""
    target = Path(path)
    if not target.parent.is_dir():
        raise UsageError(f"--uds {path!r}: its directory does not exist")
    if not target.exists():
        return
    if not target.is_socket():
        raise UsageError(f"--uds {path!r} exists and is not a socket: pick another path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            target.unlink()  # nobody listens: what a killed server leaves behind
            return
    raise UsageError(f"--uds {path!r}: another server is listening on it")


def hypercorn_config(config: ServerConfig):
    from hypercorn.config import Config

    hyper = Config()
    host = f"[{config.host}]" if ":" in config.host else config.host
    hyper.bind = [f"{host}:{config.port}"]  # Hypercorn sets TCP_NODELAY on the listening socket
    if config.uds is not None:
        # Same routes on a Unix socket: a target on the same host skips the TCP stack.
        hyper.bind.append(f"unix:{config.uds}")
    hyper.keep_alive_timeout = KEEP_ALIVE_S
    hyper.keep_alive_max_requests = 1_000_000  # a target reuses one connection for its whole run
    hyper.graceful_timeout = 5  # after our own drain, only idle keep-alive connections are left
    hyper.accesslog = None  # per-request logging costs more than a draft on a GPU; /metrics counts instead
    hyper.errorlog = logging.getLogger("hypercorn.error")
    return hyper


async def serve(config: ServerConfig) -> int:
    from hypercorn.asyncio import serve as hypercorn_serve

    from drafter.server.app import create_app

    app = create_app(config)
    runtime = app.state.runtime
    try:
        await hypercorn_serve(
            app, hypercorn_config(config), shutdown_trigger=lambda: wait_for_shutdown(runtime)
        )
    finally:
        if config.uds is not None:
            Path(config.uds).unlink(missing_ok=True)  # a socket file outlives its server otherwise
    code = 1 if runtime.fatal.is_set() else 0
    if not runtime.stop_engine_thread():
        # Interpreter exit while torch runs in another thread aborts the process ("terminate called
        # without an active exception"); a stop during a long load or compile skips that instead.
        log.warning("engine thread still busy (%s); exiting without waiting for it", runtime.stage)
        logging.shutdown()
        os._exit(code)
    log.info("stopped" if code == 0 else "stopped: the engine could not start")
    return code


async def wait_for_shutdown(runtime) -> None:
    """Hypercorn's shutdown trigger: returns once a signal arrived and in-flight requests are done, or at
    once when the engine could not start."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    fatal = asyncio.ensure_future(runtime.fatal.wait())
    await asyncio.wait({stopping, fatal}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    fatal.cancel()
    if runtime.fatal.is_set():
        return
    log.info("shutdown signal received")
    await runtime.drain()


if __name__ == "__main__":
    sys.exit(main())
