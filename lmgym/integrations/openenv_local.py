"""Run an OpenEnv app (any ASGI app ``openenv``'s ``create_app`` made) on a loopback
port in a background thread: for tests, examples and a single-machine setup."""

from __future__ import annotations

import logging
import socket
import threading
import time
from types import TracebackType
from typing import Any


class _ClosedSessionNoise(logging.Filter):
    """Drops uvicorn's report of a WebSocket the client closed first: openenv-core
    0.3's server closes a session's socket again after the client's ``close``
    message, and uvicorn logs the resulting ``WebSocketDisconnect`` as an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return type(error).__name__ not in ("WebSocketDisconnect", "ClientDisconnected")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LocalServer:
    """``with LocalServer(app) as url:`` serves ``app`` with uvicorn on
    ``http://127.0.0.1:<free port>`` in a daemon thread, and stops it on exit.

    Args:
        app: the ASGI app.
        host: the address to bind (loopback by default).
        start_timeout: seconds to wait for the server to accept connections.

    Raises:
        RuntimeError: the server did not start within ``start_timeout``.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", start_timeout: float = 30.0) -> None:
        import uvicorn

        self.host, self.port = host, free_port(host)
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", ws="auto")
        self._server = uvicorn.Server(config)
        noise = _ClosedSessionNoise()
        if not any(
            isinstance(f, _ClosedSessionNoise) for f in logging.getLogger("uvicorn.error").filters
        ):
            logging.getLogger("uvicorn.error").addFilter(noise)
        self._thread = threading.Thread(target=self._server.run, name="openenv-server", daemon=True)
        self.start_timeout = start_timeout

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self._server.started:  # bounded: at most start_timeout seconds
            if time.monotonic() > deadline or not self._thread.is_alive():
                self._server.should_exit = True
                raise RuntimeError(f"the OpenEnv server on {self.url} did not start")
            time.sleep(0.02)
        return self.url

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


__all__ = ["LocalServer", "free_port"]
