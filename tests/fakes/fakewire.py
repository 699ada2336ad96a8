"""What the fake cuzk daemon and the fake cuzk-bench share: addresses as upstream parses them, and the wire.

The real pair speaks gRPC (tonic, HTTP/2); the fakes speak one JSON object per line over the same kind of
socket, at the same address, so a bench that dials where no daemon listens fails exactly as the real one does.
The paths the upstream tools hard-code (the default config file, the default Unix socket, curio's parameter
directory) are taken under $FAKES_ROOT, the sandbox's stand-in for "/", so a test never touches the host's.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from datetime import datetime, timezone


def rooted(path: str) -> str:
    """An upstream default absolute path, inside the sandbox."""
    root = os.environ.get("FAKES_ROOT", "")
    return os.path.join(root, path.lstrip("/")) if root else path


def socket_addr(text: str) -> tuple[str, int]:
    """Rust's `SocketAddr::from_str`: an IP literal and a port ("127.0.0.1:9820", "[::1]:9820"); no host names."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"invalid socket address syntax: {text}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    ipaddress.ip_address(host)  # ValueError for a name, an empty host or "http://…"
    return host, int(port)


def log(target: str, message: str, level: str = "INFO") -> None:
    """A line as tracing_subscriber's fmt layer prints it."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    print(f"{stamp}  {level} {target}: {message}", flush=True)


def send(stream, message: dict) -> None:
    stream.write((json.dumps(message) + "\n").encode())
    stream.flush()


def receive(stream) -> dict | None:
    line = stream.readline()
    return json.loads(line) if line else None


def fail(message: str, *causes: str, code: int = 1) -> None:
    """anyhow's report of an error returned from main, and its exit status."""
    text = f"Error: {message}"
    if causes:
        text += "\n\nCaused by:\n" + "\n".join(f"    {i}: {c}" if len(causes) > 1 else f"    {c}"
                                                for i, c in enumerate(causes))
    print(text, file=sys.stderr, flush=True)
    sys.exit(code)


def family_of(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
