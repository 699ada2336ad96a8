"""`vastctl route`: its bad input and a taken address are one error line each, and nothing is served."""

from __future__ import annotations

import socket

import pytest


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
    assert result.code == 1
    assert result.err.splitlines()[-1] == (f"error: cannot listen on 127.0.0.1:{port}: the address is in use (another"
                                           " router or a cuzk daemon?) or not this host's; set route.listen or --listen")
