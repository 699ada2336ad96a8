"""Integers from outside past what the state file holds (SQLite's 64-bit INTEGER): vast's ids and counts are
refused or ignored where they enter, with a note, and the rest of the answer is still acted on; an operator's
out-of-range number is exit 2 with one error line."""

from __future__ import annotations

import json

import pytest
import responses
from helpers.mocked_vast import API, LIST, fleet, instance, states
from helpers.provider_vast import BASE, RecordingClock, create_request
from helpers.provider_vast import KEY as VAST_KEY

from vastctl.providers.base import ProviderError
from vastctl.providers.vast import VastProvider

HUGE = "1" + "0" * 400  # 10^400: valid JSON, a Python int, nothing SQLite can store
PAST_SQLITE = str(2**63)
ENORMOUS = "9" * 5000  # past Python's 4,300-digit conversion limit: once made the whole answer "not JSON"


def listing_body(entries: list[str]) -> str:
    return '{"success": true, "instances": [' + ", ".join(entries) + '], "next_token": null}'


def raw_entry(raw_id: str, label: str, **fields) -> str:
    rest = json.dumps({"label": label, "actual_status": "running", "gpu_name": "RTX 4090", "num_gpus": 1,
                       "dph_total": 0.4, **fields})
    return '{"id": ' + raw_id + ", " + rest[1:]


@pytest.fixture
def vast(clock):
    return VastProvider(VAST_KEY, BASE, clock=clock)


@pytest.fixture
def clock():
    return RecordingClock()


@pytest.mark.parametrize("raw_id", [HUGE, PAST_SQLITE, "-" + HUGE, ENORMOUS])
def test_a_listing_entry_with_an_id_out_of_range_is_left_out_with_a_note(vast, raw_id):
    with responses.RequestsMock() as mocked:
        mocked.get(f"{BASE}/api/v1/instances/", content_type="application/json",
                   body=listing_body([raw_entry("7", "vastctl-good"), raw_entry(raw_id, "vastctl-evil")]))
        listed = vast.list_instances()
    assert [(item.id, item.label) for item in listed] == [(7, "vastctl-good")]
    (note,) = vast.listing_notes
    assert "out of range" in note and "vastctl-evil" in note and len(note) < 400


def test_other_integers_past_range_are_read_as_missing(vast):
    big = str(2**63)
    with responses.RequestsMock() as mocked:
        mocked.get(f"{BASE}/api/v1/instances/", content_type="application/json",
                   body=listing_body(['{"id": 8, "label": "vastctl-x", "machine_id": ' + big + ', "num_gpus": '
                                      + HUGE + ', "gpu_name": ' + HUGE + "}"]))
        (item,) = vast.list_instances()
    assert (item.id, item.machine_id, item.num_gpus, item.gpu_name) == (8, None, None, None)
    assert vast.listing_notes == []


def test_a_create_answered_with_an_id_out_of_range_is_an_unknown_outcome(vast):
    with responses.RequestsMock() as mocked:
        mocked.put(f"{BASE}/api/v0/asks/555/", content_type="application/json",
                   body='{"success": true, "new_contract": ' + str(2**63) + "}")
        with pytest.raises(ProviderError, match="outcome is unknown"):
            vast.create_instance(create_request())


def test_reconcile_still_kills_the_dead_while_vast_lists_an_impossible_id(store, cli, vast_api, tmp_path, monkeypatch):
    config = tmp_path / "back-to-back.yaml"  # cron's two listings are a minute apart; here they are back to back
    config.write_text("reconcile:\n  confirm_after: 0s\n")
    monkeypatch.setenv("VASTCTL_CONFIG", str(config))
    items = fleet(store, 2)
    items[1] = instance(101, "vastctl-1", status="exited")
    entries = [json.dumps(item) for item in items] + [raw_entry(HUGE, "vastctl-evil"),
                                                       raw_entry(PAST_SQLITE, "someone-else")]
    vast_api.get(LIST, body=listing_body(entries), content_type="application/json")
    vast_api.delete(f"{API}/api/v0/instances/101/", json={"success": True})
    for _ in range(2):  # exited in two consecutive listings
        result = cli("reconcile", "--json")
        assert result.code == 0, result.err
        notes = [error for error in json.loads(result.out)["errors"] if "out of range" in error]
        assert len(notes) == 2
    assert states(store) == {"vastctl-0": ("running", False), "vastctl-1": ("killed", True)}
    assert [r[0] for r in store.execute("SELECT ok FROM vast_listings")] == [1, 1]
    human = cli("reconcile")
    assert human.code == 0 and "out of range" in human.out + human.err and "Traceback" not in human.err


@pytest.mark.parametrize("option", ["--since", "--limit"])
@pytest.mark.parametrize("value", ["9" * 30, str(2**63)])
def test_events_with_a_number_past_range_is_exit_2_with_one_line(ready, cli, option, value):
    result = cli("events", option, value)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("error: ") and len(result.err.splitlines()) == 1 and option in result.err
    assert cli("events", option, str(2**63 - 1)).code == 0


def test_events_in_the_library_refuses_a_number_past_range(store):
    from vastctl.errors import BadInput
    from vastctl.views import fleet as fleet_module

    with pytest.raises(BadInput, match="--since must be at most"):
        fleet_module.events(store, since=2**63)
