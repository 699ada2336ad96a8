"""`vastctl route`: its bad input and a taken address are one error line each, and nothing is served."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from vastctl import config as config_module

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1:99999", ":9820", "127.0.0.1:port"])
def test_a_listen_address_that_is_not_host_port_is_exit_2(cli, tmp_path, address):
    db = tmp_path / "state.db"
    assert cli("--db", db, "init").code == 0
    result = cli("--db", db, "route", "--listen", address)
    assert result.code == 2 and result.out == ""
    assert result.err == f"error: --listen {address!r} is not host:port (a port 0-65535): give e.g. 127.0.0.1:9820\n"


def test_a_missing_state_file_is_refused_before_anything_listens(cli, tmp_path):
    result = cli("--db", tmp_path / "none.db", "route", "--listen", "127.0.0.1:0")
    assert result.code == 2 and result.err.startswith("error: ") and result.err.count("\n") == 1


@pytest.mark.slow  # binds a port through gRPC
def test_an_address_in_use_is_exit_1_in_one_line(cli, tmp_path):
    db = tmp_path / "state.db"
    assert cli("--db", db, "init").code == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("--db", db, "route", "--listen", f"127.0.0.1:{port}")
    assert result.code == 1 and result.out == ""
    assert result.err == (f"error: port {port} is already in use on 127.0.0.1 (nginx's Curio balancer? another router?"
                          f" a cuzk daemon? `ss -ltnp 'sport = :{port}'` names it): stop that program, or give --listen"
                          " a free port\n")


@pytest.mark.slow  # binds a port
def test_route_listen_in_use_names_the_setting_to_change(cli, tmp_path):
    db, config = tmp_path / "state.db", tmp_path / "config.yaml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config.write_text(f"route:\n  listen: 127.0.0.1:{port}\n")
        assert cli("--config", config, "--db", db, "init").code == 0
        result = cli("--config", config, "--db", db, "route")
    assert result.code == 1 and result.out == ""
    assert result.err.startswith(f"error: port {port} is already in use on 127.0.0.1 (")
    assert result.err.endswith("stop that program, or give route.listen a free port\n") and result.err.count("\n") == 1


def test_an_address_not_of_this_host_is_exit_1_in_one_line(cli, tmp_path):
    db = tmp_path / "state.db"
    assert cli("--db", db, "init").code == 0
    result = cli("--db", db, "route", "--listen", "192.0.2.1:0")  # TEST-NET-1 (RFC 5737): no host has it
    assert result.code == 1 and result.out == ""
    assert result.err == ("error: cannot listen on 192.0.2.1:0: 192.0.2.1 is not an address of this host: give --listen"
                          " one of its addresses\n")


def test_the_routers_default_port_and_the_nginx_alternatives_differ():
    """Both installed, nginx's reload would fail to bind with exit 0 (the failure only in its error.log)."""
    nginx = (ROOT / "jobs" / "nginx-cuzk-grpc.conf").read_text()
    (nginx_listen,) = re.findall(r"^\s*listen (\S+) http2;", nginx, flags=re.M)
    socket_unit = (ROOT / "jobs" / "vastctl-route.socket").read_text()
    assert config_module.RouteSection().listen == "127.0.0.1:9820" and "ListenStream=127.0.0.1:9820" in socket_unit
    assert nginx_listen == "127.0.0.1:9830"
