"""Where a machine's boot fetches its proving parameters and what it benches: launch.params_mirror (the machine's
IPFS_GATEWAY, which `curio fetch-params` reads) and launch.sector_size (the parameter set, the bench's C1 input),
with the boot script under bash against the fakes and a loopback HTTP mirror holding files named by CID; and the
seconds each boot stage took, reported with `running` and shown by `fleet --json`."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.boot import FAKES, Machine, start_manager
from helpers.fake_vast import FakeVast
from helpers.serving import on_a_thread, run_vastctl

from vastctl import config as config_module
from vastctl.errors import BadInput
from vastctl.machine import onstart


def fake_curio():
    """The fake curio as a module: its file names and CIDs are what the mirror must hold."""
    loader = importlib.machinery.SourceFileLoader("fake_curio", str(FAKES / "curio"))
    spec = importlib.util.spec_from_loader("fake_curio", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class Mirror(ThreadingHTTPServer):
    """An operator's parameter mirror: a directory of files named by CID under /ipfs/, served over HTTP; the paths
    asked for are recorded."""

    def __init__(self, root: Path):
        self.asked: list[str] = []
        self.lock = threading.Lock()
        mirror = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with mirror.lock:
                    mirror.asked.append(self.path)
                super().do_GET()

        super().__init__(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def mirror(tmp_path):
    """The mirror as docs/params-mirror.md builds one: every file of both sets under /ipfs/CID, and a 64 GiB C1."""
    curio = fake_curio()
    root = tmp_path / "mirror"
    (root / "ipfs").mkdir(parents=True)
    for name in {*curio.FILES_32GIB, *curio.FILES_64GIB}:
        (root / "ipfs" / curio.fake_cid(name)).write_bytes(f"mirrored {name}\n".encode())
    (root / "c1-64GiB.json").write_text('{"SectorNum": 2, "Phase1Out": "NjQ="}')
    with on_a_thread(Mirror(root)) as server:
        server.curio = curio
        yield server


@pytest.fixture
def vast():
    with on_a_thread(FakeVast()) as server:
        yield server


def boot(tmp_path, vast, launch: str) -> Machine:
    manager = start_manager(tmp_path, launch)
    machine = Machine(manager, vast, tmp_path / "machine").boot()
    machine.wait_for(lambda r: r["state"] == "running", "the machine runs")
    return machine


@pytest.mark.slow
def test_a_machine_launched_with_a_params_mirror_fetches_from_it_and_says_where_its_boot_went(tmp_path, vast, mirror):
    machine = boot(tmp_path, vast, f"  params_mirror: {mirror.url}/ipfs/\n")
    try:
        env = machine.create["env"]
        assert env["IPFS_GATEWAY"] == f"{mirror.url}/ipfs/" and env["VASTCTL_SECTOR_SIZE"] == "32GiB"
        curio = mirror.curio
        assert sorted(mirror.asked) == sorted(f"/ipfs/{curio.fake_cid(name)}" for name in curio.FILES_32GIB)
        for name in curio.FILES_32GIB:  # what the machine proves with is what the mirror holds
            assert (machine.zk / "params" / name).read_text() == f"mirrored {name}\n"
        assert f"fetching 32GiB parameters from {mirror.url}/ipfs/" in machine.text("onstart.log")
        fleet = json.loads(run_vastctl("fleet", "--json", env=machine.manager.env).stdout)
        (shown,) = fleet["instances"]
        assert list(shown["boot_stages"]) == ["fetch", "daemon", "warmup", "bench", "join"]
        assert all(isinstance(s, (int, float)) and s >= 0 for s in shown["boot_stages"].values())
        log = machine.text("onstart.log")
        for stage in ("fetch", "daemon", "warmup", "bench", "join"):
            assert f"stage {stage} took " in log
    finally:
        machine.stop()
        machine.manager.stop()


@pytest.mark.slow
def test_a_64gib_config_changes_the_fetch_and_the_bench_input(tmp_path, vast, mirror):
    machine = boot(tmp_path, vast, f"  params_mirror: {mirror.url}/ipfs/\n  sector_size: 64GiB\n"
                                   f"  bench_input: {mirror.url}/c1-64GiB.json\n")
    try:
        curio = mirror.curio
        fetched = [path for path in mirror.asked if path.startswith("/ipfs/")]
        assert sorted(fetched) == sorted(f"/ipfs/{curio.fake_cid(name)}" for name in curio.FILES_64GIB)
        assert "/c1-64GiB.json" in mirror.asked
        assert (machine.zk / "params" / curio.FILES_64GIB[0]).exists()
        assert not (machine.zk / "params" / curio.FILES_32GIB[0]).exists()
        assert (machine.zk / "c1-64GiB.json").read_text() == '{"SectorNum": 2, "Phase1Out": "NjQ="}'
        assert "fetching 64GiB parameters" in machine.text("onstart.log")
    finally:
        machine.stop()
        machine.manager.stop()


def test_a_64gib_launch_without_its_bench_input_is_refused_before_anything_is_rented():
    launch = config_module.from_mapping({"launch": {"sector_size": "64GiB", "vastctl_source": "vastctl==0.1.0",
                                                    "install": "true"}}).launch
    (problem,) = onstart.boot_problems(launch)
    assert "launch.bench_input" in problem and "64GiB" in problem
    launch.bench_input = "https://files.example.net/c1-64GiB.json"
    assert onstart.boot_problems(launch) == []
    assert onstart.boot_env(launch)["VASTCTL_C1_URL"] == "https://files.example.net/c1-64GiB.json"


@pytest.mark.parametrize("key,value", [
    ("params_mirror", "ftp://mirror.example/ipfs/"), ("params_mirror", "https://mirror.example/ipfs"),
    ("params_mirror", "https://mirror.example/$(reboot)/"), ("sector_size", "32G"), ("bench_input", "c1.json"),
])
def test_a_bad_mirror_or_sector_size_names_the_key(key, value):
    with pytest.raises(BadInput) as refused:
        config_module.from_mapping({"launch": {key: value}})
    assert f"launch.{key}" in str(refused.value)


def test_running_takes_only_known_stages_with_seconds(cli, tmp_path):
    from vastctl.state import lifecycle

    assert lifecycle.validate_stages({"join": "3", "fetch": 412}) == {"fetch": 412.0, "join": 3.0}
    for bad in ({"boot": 3}, {"fetch": -1}, {"fetch": "soon"}, {"fetch": 1e12}, [1, 2]):
        with pytest.raises(BadInput):
            lifecycle.validate_stages(bad)
    result = cli("running", "--uuid", "u-1", "--stages", "fetch")
    assert result.code == 2 and result.err.startswith("error: --stages takes STAGE=SECONDS")
