"""deadline_http: an HTTP client for the Anthropic SDK in which a deadline bounds the whole exchange.

The SDK's timeout, like every socket timeout, bounds each read: a reply sent
one byte every few seconds never trips it, and a step could run for minutes
past `agent.deadline`. Here every network operation (connect, TLS, each write
and each read, of the headers and of the body alike) waits at most the time
`left()` says remains, and none starts once it is gone: it fails as a timeout,
which the SDK reports as APITimeoutError and the step records as an API error.

`left` reads the step's injected clock. Imported inside llm.run() only, like the SDK.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import httpcore2
import httpx2

MIN_WAIT_S = 0.001  # a socket timeout of 0 would mean "do not block", not "no time left"


def client(left: Callable[[], float]) -> httpx2.Client:
    """An httpx2 client for anthropic.Anthropic(http_client=…) whose every operation ends by `left()` reaching 0."""
    return httpx2.Client(transport=DeadlineTransport(left))


class DeadlineTransport(httpx2.HTTPTransport):
    """The default transport over a connection pool whose network backend keeps the deadline."""

    def __init__(self, left: Callable[[], float]):
        super().__init__()
        self._pool.close()  # the default pool, replaced by one on the deadline backend (same settings otherwise)
        self._pool = httpcore2.ConnectionPool(ssl_context=httpx2.create_ssl_context(),
                                              network_backend=DeadlineBackend(left))


def _bounded(left: Callable[[], float], timeout: float | None, fail: type[Exception], what: str) -> float:
    remaining = left()
    if remaining <= 0:
        raise fail(f"{what}: the step's deadline passed")
    return max(MIN_WAIT_S, remaining if timeout is None else min(timeout, remaining))


class DeadlineBackend(httpcore2.NetworkBackend):
    def __init__(self, left: Callable[[], float], inner: httpcore2.NetworkBackend | None = None):
        self.left = left
        self.inner = inner or httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore2.NetworkStream:
        wait = _bounded(self.left, timeout, httpcore2.ConnectTimeout, "connect")
        stream = self.inner.connect_tcp(host, port, timeout=wait, local_address=local_address,
                                        socket_options=socket_options)
        return DeadlineStream(stream, self.left)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore2.NetworkStream:
        wait = _bounded(self.left, timeout, httpcore2.ConnectTimeout, "connect")
        return DeadlineStream(self.inner.connect_unix_socket(path, timeout=wait, socket_options=socket_options),
                              self.left)

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)  # httpcore's own retries only, which this client does not enable


class DeadlineStream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream, left: Callable[[], float]):
        self.inner = inner
        self.left = left

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, timeout=_bounded(self.left, timeout, httpcore2.ReadTimeout, "read"))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, timeout=_bounded(self.left, timeout, httpcore2.WriteTimeout, "write"))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        wait = _bounded(self.left, timeout, httpcore2.ConnectTimeout, "TLS handshake")
        return DeadlineStream(self.inner.start_tls(ssl_context, server_hostname=server_hostname, timeout=wait),
                              self.left)

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)
