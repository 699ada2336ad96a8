"""vast's market at the command line, faked with `responses`: the operator's config and key, vast's offer
records, and the rows a launch leaves (test_cli_market, test_vast_prices)."""

from __future__ import annotations

from helpers.serving import query


def configure(cli, tmp_path, monkeypatch, *, api: str, key: str, max_instances: int, max_hourly_spend: float) -> None:
    """A config that can launch (an image, a manager URL), vast's key and URL in the environment, `vastctl init`."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "server:\n  url: https://manager.example\n"
        f"fleet:\n  max_instances: {max_instances}\n  max_dph: 1.0\n  max_hourly_spend: {max_hourly_spend}\n"
        "launch:\n  image: ghcr.io/x/cuzk:1\n"
    )
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    monkeypatch.setenv("VAST_API_KEY", key)
    monkeypatch.setenv("VAST_API_URL", api)
    assert cli("init").code == 0


def offer(oid, machine_id, dph) -> dict:
    """One offer as vast's bundles search answers it."""
    return {"id": oid, "machine_id": machine_id, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": dph,
            "cpu_ram": 515000, "inet_down": 900.0, "reliability": 0.99}


def rows(db_path):
    return query(db_path, "SELECT * FROM instances ORDER BY created_at")
