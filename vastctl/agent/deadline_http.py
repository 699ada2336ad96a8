"""deadline_http: the Anthropic SDK's HTTP client, with a deadline that bounds the whole exchange.

The SDK's timeout, like every socket timeout, bounds each read: a reply sent
one byte every few seconds never trips it, and a step could run for minutes
past `agent.deadline`. Here every network operation (connect, TLS, each write
and each read, of the headers and of the body alike) waits at most the time
`left()` says remains, and none starts once it is gone: it fails as a timeout,
which the SDK reports as APITimeoutError and the step records as an API error.

The SDK's own DefaultHttpxClient is kept (its limits, TLS settings and the
environment's proxies); only the network backend under each of its connection
pools is wrapped. `left` reads the step's injected clock. Imported inside
llm.run() only, like the SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

import httpcore2
import httpx2

if TYPE_CHECKING:
    import ssl

MIN_WAIT_S = 0.001  # a socket timeout of 0 would mean "do not block", not "no time left"


def bound(http_client: httpx2.Client, left: Callable[[], float]) -> httpx2.Client:
    """`http_client` (the SDK's DefaultHttpxClient: its limits, TLS and environment proxies kept) with every
    connection pool on the deadline backend; RuntimeError when httpx2 no longer has the pools this relies on
    (an upgrade must not quietly lose the deadline)."""
    transports = [http_client._transport, *(t for t in http_client._mounts.values() if t is not None)]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            raise RuntimeError(f"httpx2 {httpx2.__version__}: {type(transport).__name__} has no connection pool with"
                               " a network backend; agent.deadline could not bound the Messages API calls")
        pool._network_backend = DeadlineBackend(left, pool._network_backend)
    return http_client


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

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        wait = _bounded(self.left, timeout, httpcore2.ConnectTimeout, "TLS handshake")
        return DeadlineStream(self.inner.start_tls(ssl_context, server_hostname=server_hostname, timeout=wait),
                              self.left)

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)
