"""route/listener.py: the socket systemd passes (LISTEN_PID, LISTEN_FDS, the fd) taken only when it is this
process's and a listening TCP socket, the variables removed either way; else route.listen bound. The units that
pass it (jobs/vastctl-route.socket, .service) agree with the router. A router process on a passed socket:
tests/test_route_restart.py."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from vastctl import config as config_module
from vastctl.errors import BadInput
from vastctl.route import front, listener

JOBS = Path(__file__).resolve().parents[1] / "jobs"
PID = 4242  # the process the variables are for, in these tests


def env(**extra: str) -> dict[str, str]:
    return {"LISTEN_PID": str(PID), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "vastctl-route.socket", "PATH": "/bin",
            **extra}


def test_no_variables_no_socket_and_the_environment_is_left_alone():
    environ = {"PATH": "/bin"}
    assert listener.from_systemd(environ, pid=PID, fd=999) is None
    assert environ == {"PATH": "/bin"}


def test_variables_meant_for_another_process_are_not_taken_and_are_removed():
    environ = env(LISTEN_PID=str(PID + 1))
    assert listener.from_systemd(environ, pid=PID, fd=999) is None
    assert environ == {"PATH": "/bin"}


@pytest.mark.parametrize("count", ["0", "2", "x"])
def test_anything_but_one_socket_is_refused_naming_the_unit(count):
    environ = env(LISTEN_FDS=count)
    with pytest.raises(BadInput, match=r"give jobs/vastctl-route.socket exactly one ListenStream"):
        listener.from_systemd(environ, pid=PID, fd=999)
    assert environ == {"PATH": "/bin"}


def test_a_descriptor_that_is_not_a_socket_is_refused():
    read, write = os.pipe()
    try:
        with pytest.raises(BadInput, match=rf"fd {read}, which systemd said is the router's socket .* is not a socket"):
            listener.from_systemd(env(), pid=PID, fd=read)
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize("kind", ["datagram", "not listening", "unix"])
def test_a_socket_that_is_not_a_listening_tcp_one_is_refused_and_closed(kind):
    sock = {"datagram": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
            "not listening": lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
            "unix": lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)}[kind]()
    fd = sock.detach()  # from_systemd owns it now, as it owns fd 3
    with pytest.raises(BadInput, match=rf"fd {fd} from systemd is not a listening TCP socket: .*ListenStream=host:port"):
        listener.from_systemd(env(), pid=PID, fd=fd)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed


@pytest.mark.slow  # a listening socket
def test_a_listening_tcp_socket_is_taken_blocking_not_inherited_and_the_variables_removed():
    held = socket.create_server(("127.0.0.1", 0))
    held.setblocking(False)  # as a unit may leave it: the router's is blocking, as one it binds
    fd = os.dup(held.fileno())
    os.set_inheritable(fd, True)  # as systemd passes it
    environ = env()
    taken = listener.from_systemd(environ, pid=PID, fd=fd)
    try:
        assert taken is not None and taken.fileno() == fd
        assert taken.getsockname() == held.getsockname() and listener.name(taken) == held.getsockname()
        assert taken.getblocking() and not os.get_inheritable(fd)
        assert environ == {"PATH": "/bin"}
        with socket.create_connection(held.getsockname()):
            accepted, _ = taken.accept()  # the one socket, from either descriptor
            accepted.close()
    finally:
        if taken is not None:
            taken.close()
        held.close()


@pytest.mark.slow  # listening sockets
def test_take_binds_the_address_when_systemd_passed_nothing():
    sock, inherited = listener.take("127.0.0.1:0", environ={"PATH": "/bin"})
    try:
        assert not inherited and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        host, port = listener.name(sock)
        assert host == "127.0.0.1" and port > 0
        with pytest.raises(OSError):
            listener.bind(f"127.0.0.1:{port}")  # taken
    finally:
        sock.close()


def unit(name: str) -> dict[str, list[str]]:
    """A unit file's keys and their values (a key may be given more than once)."""
    found: dict[str, list[str]] = {}
    for key, value in re.findall(r"^(\w+)=(.*)$", (JOBS / name).read_text(), re.M):
        found.setdefault(key, []).append(value)
    return found


def test_the_socket_unit_listens_on_route_listen_s_default_once_for_the_router_and_the_service_takes_it():
    socket_unit, service = unit("vastctl-route.socket"), unit("vastctl-route.service")
    assert socket_unit["ListenStream"] == [config_module.from_mapping({}).route.listen]
    assert socket_unit["Accept"] == ["no"] and socket_unit["Service"] == ["vastctl-route.service"]
    assert int(socket_unit["Backlog"][0]) >= listener.BACKLOG
    assert socket_unit["WantedBy"] == ["sockets.target"]
    assert service["Requires"] == ["vastctl-route.socket"] and "vastctl-route.socket" in service["After"][0]
    assert int(service["LimitNOFILE"][0]) > 4 * front.MAX_CONNECTIONS  # each connection's descriptors, with room
