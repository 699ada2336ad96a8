"""The vast.ai client: the requests that go out, retries, and never trusting a bad or partial answer."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlparse

import pytest
import requests
import responses
from helpers.provider_vast import BASE, KEY, RecordingClock, create_request, hang

from vastctl.clock import SYSTEM
from vastctl.config import Config
from vastctl.errors import BadInput
from vastctl.markets import get_provider
from vastctl.providers.base import DeadlinePassed, OfferGone, OfferQuery, ProviderError, ProviderRejected
from vastctl.providers.vast import VastProvider, find_api_key


@pytest.fixture
def clock():
    return RecordingClock()


@pytest.fixture
def sleeps(clock):
    return clock.sleeps


@pytest.fixture
def vast(clock):
    return VastProvider(KEY, BASE, clock=clock)


@pytest.fixture
def mocked():
    with responses.RequestsMock(assert_all_requests_are_fired=True) as rsps:
        yield rsps


def assert_clean(call):
    assert call.request.headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in call.request.url


def body_of(call):
    return json.loads(call.request.body)


def query_of(call):
    return {k: v[0] for k, v in parse_qs(urlparse(call.request.url).query).items()}


def instance(vid, **extra):
    return {"id": vid, "label": f"vastctl-{vid}", "actual_status": "running", "machine_id": 1000 + vid,
            "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.4, **extra}


# --- listing ----------------------------------------------------------------------------------------


def test_listing_follows_every_page(vast, mocked):
    url = f"{BASE}/api/v1/instances/"
    mocked.get(url, json={"success": True, "instances": [instance(1), instance(2)], "next_token": "t1",
                          "total_instances": 3},
               match=[responses.matchers.query_param_matcher(
                   {"limit": "25", "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
                    "select_filters": "{}"})])
    mocked.get(url, json={"success": True, "instances": [instance(3)], "next_token": None, "total_instances": 3},
               match=[responses.matchers.query_param_matcher(
                   {"limit": "25", "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
                    "select_filters": "{}", "after_token": "t1"})])
    listed = vast.list_instances()
    assert [item.id for item in listed] == [1, 2, 3]
    assert listed[0].label == "vastctl-1" and listed[0].machine_id == 1001 and listed[0].dph_total == 0.4
    assert len(mocked.calls) == 2
    for call in mocked.calls:
        assert call.request.method == "GET"
        assert urlparse(call.request.url).path == "/api/v1/instances/"
        assert_clean(call)


def test_listing_error_on_page_two_raises(vast, mocked):
    url = f"{BASE}/api/v1/instances/"
    first = {"limit": "25", "order_by": json.dumps([{"col": "id", "dir": "asc"}]), "select_filters": "{}"}
    mocked.get(url, json={"instances": [instance(1)], "next_token": "t1", "total_instances": 2},
               match=[responses.matchers.query_param_matcher(first)])
    mocked.get(url, status=500, json={"success": False, "error": "server_error"},
               match=[responses.matchers.query_param_matcher({**first, "after_token": "t1"})])
    with pytest.raises(ProviderError):
        vast.list_instances()
    assert len(mocked.calls) == 2


def test_listing_bad_json_on_page_two_raises(vast, mocked):
    url = f"{BASE}/api/v1/instances/"
    mocked.get(url, body='{"instances": [{"id": 2', content_type="application/json",
               match=[responses.matchers.query_param_matcher({"after_token": "t1"}, strict_match=False)])
    mocked.get(url, json={"instances": [instance(1)], "next_token": "t1"})
    with pytest.raises(ProviderError, match="JSON"):
        vast.list_instances()


def test_listing_fewer_than_total_is_partial(vast, mocked):
    mocked.get(f"{BASE}/api/v1/instances/", json={"instances": [instance(1)], "next_token": None,
                                                  "total_instances": 2})
    with pytest.raises(ProviderError, match="partial"):
        vast.list_instances()


@pytest.mark.parametrize("answer", [
    {"body": '{"instances": [{"id": 1, "label": "vastctl-1"'},  # truncated JSON
    {"json": {"success": True}},  # no instances key
    {"json": {"instances": None}},
    {"json": {"instances": [{"label": "no id"}]}},
    {"json": [1, 2]},
    {"json": {"success": False, "error": "invalid_token", "msg": "bad cursor"}},  # success:false on 200
])
def test_listing_never_returns_a_bad_answer(vast, mocked, answer):
    mocked.get(f"{BASE}/api/v1/instances/", status=200, content_type="application/json", **answer)
    with pytest.raises(ProviderError):
        vast.list_instances()


def test_listing_empty_fleet_is_fine(vast, mocked):
    mocked.get(f"{BASE}/api/v1/instances/", json={"success": True, "instances": [], "next_token": None,
                                                  "total_instances": 0})
    assert vast.list_instances() == []


def test_listing_repeating_cursor_raises(vast, mocked):
    mocked.get(f"{BASE}/api/v1/instances/", json={"instances": [instance(1)], "next_token": "same"})
    with pytest.raises(ProviderError, match="cursor"):
        vast.list_instances()


def test_listing_naming_one_instance_twice_differently_is_not_trusted(vast, mocked):
    url = f"{BASE}/api/v1/instances/"
    mocked.get(url, json={"instances": [instance(1), instance(2)], "next_token": "t1", "total_instances": 3})
    mocked.get(url, json={"instances": [instance(2, actual_status="exited"), instance(3)], "next_token": None,
                          "total_instances": 3})
    with pytest.raises(ProviderError, match="instance 2 twice with different contents"):
        vast.list_instances()


def test_listing_with_a_page_repeated_verbatim_keeps_one_of_each(vast, mocked):
    url = f"{BASE}/api/v1/instances/"
    mocked.get(url, json={"instances": [instance(1), instance(2)], "next_token": "t1"})
    mocked.get(url, json={"instances": [instance(1), instance(2), instance(3)], "next_token": None})
    assert [item.id for item in vast.list_instances()] == [1, 2, 3]


# --- retries ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_retries_with_backoff_then_succeeds(vast, mocked, sleeps, status):
    url = f"{BASE}/api/v1/instances/"
    mocked.get(url, status=status, json={"detail": "API requests too frequent endpoint threshold=1.0"})
    mocked.get(url, status=status, body="busy")
    mocked.get(url, json={"instances": [instance(7)], "next_token": None})
    assert [item.id for item in vast.list_instances()] == [7]
    assert len(mocked.calls) == 3
    assert sleeps == [0.5, 1.0]


def test_retries_are_bounded(vast, mocked, sleeps):
    mocked.get(f"{BASE}/api/v1/instances/", status=503, body="down")
    with pytest.raises(ProviderError, match="503"):
        vast.list_instances()
    assert len(mocked.calls) == 4 and len(sleeps) == 3


def test_retry_after_is_honoured(vast, mocked, sleeps):
    url = f"{BASE}/api/v1/instances/"
    mocked.get(url, status=429, headers={"Retry-After": "7"}, body="slow down")
    mocked.get(url, json={"instances": [], "next_token": None})
    vast.list_instances()
    assert sleeps == [7.0]


def test_timeouts_and_connection_errors_are_retried(vast, mocked, sleeps):
    url = f"{BASE}/api/v1/instances/"
    mocked.get(url, body=requests.ReadTimeout("read timed out"))
    mocked.get(url, body=requests.ConnectionError("reset"))
    mocked.get(url, json={"instances": [instance(1)], "next_token": None})
    assert len(vast.list_instances()) == 1
    assert len(sleeps) == 2


def test_timeout_on_every_call(vast, mocked, monkeypatch):
    seen = []
    original = vast.session.request

    def spy(*args, **kwargs):
        seen.append(kwargs.get("timeout"))
        return original(*args, **kwargs)

    monkeypatch.setattr(vast.session, "request", spy)
    mocked.get(f"{BASE}/api/v1/instances/", json={"instances": [], "next_token": None})
    mocked.get(f"{BASE}/api/v0/instances/5/", json={"instances": None})
    mocked.post(f"{BASE}/api/v0/bundles/", json={"offers": []})
    mocked.put(f"{BASE}/api/v0/instances/5/", json={"success": True})
    mocked.delete(f"{BASE}/api/v0/instances/5/", json={"success": True})
    vast.list_instances(), vast.show_instance(5), vast.search_offers(OfferQuery()), vast.stop_instance(5)
    vast.destroy_instance(5)
    assert len(seen) == 5 and all(t for t in seen)


def test_backoff_runs_on_the_injected_clock(vast, mocked, clock):
    url = f"{BASE}/api/v1/instances/"
    mocked.get(url, status=503, body="busy")
    mocked.get(url, json={"instances": [], "next_token": None})
    vast.list_instances()
    assert clock.sleeps == [0.5] and clock.monotonic() == 0.5  # no real sleep: virtual time moved


def test_a_hung_api_is_cut_off_at_the_deadline(vast, mocked, clock):
    mocked.add_callback(responses.GET, f"{BASE}/api/v1/instances/", callback=hang(clock))
    vast.deadline = 50.0
    with pytest.raises(DeadlinePassed):
        vast.list_instances()
    assert clock.monotonic() <= 50.0
    timeouts = [call.request.req_kwargs["timeout"] for call in mocked.calls]
    assert timeouts[0] == (10.0, 50.0)  # the read timeout shrinks to what is left
    assert all(read <= 50.0 for _connect, read in timeouts)


def test_a_retry_after_past_the_deadline_is_not_waited_for(vast, mocked, clock):
    mocked.get(f"{BASE}/api/v1/instances/", status=429, headers={"Retry-After": "60"}, body="slow down")
    vast.deadline = 50.0
    with pytest.raises(DeadlinePassed, match="429.*waiting 60s more would pass the deadline"):
        vast.list_instances()
    assert clock.sleeps == [] and len(mocked.calls) == 1


def test_no_call_starts_after_the_deadline(vast, mocked, clock):
    vast.deadline = 10.0
    clock.advance(10.0)
    with pytest.raises(DeadlinePassed, match="not called"):
        vast.list_instances()
    assert len(mocked.calls) == 0


def test_search_quota_is_never_retried(vast, mocked, sleeps):
    mocked.post(f"{BASE}/api/v0/bundles/", status=429, headers={"X-RateLimit-Reset": "1767225600"},
                json={"success": False, "error": "search_quota_exceeded", "msg": "daily quota"})
    with pytest.raises(ProviderRejected, match="quota"):
        vast.search_offers(OfferQuery(gpu_names=["RTX 4090"]))
    assert len(mocked.calls) == 1 and sleeps == []


def test_errors_never_carry_the_key(mocked, clock):
    vast = VastProvider(KEY, BASE, clock=clock)
    mocked.get(f"{BASE}/api/v0/instances/3/", status=401, json={"error": "auth_error", "msg": f"bad key {KEY}"})
    with pytest.raises(ProviderRejected) as info:
        vast.show_instance(3)
    assert KEY not in str(info.value) and "VAST_API_KEY" in str(info.value)
    assert KEY not in repr(vast)


@pytest.mark.parametrize("status,body,says_key", [
    (404, {"success": False, "error": "auth_error", "msg": "Invalid user key"}, True),  # /bundles/' bad key
    (404, {"success": False, "error": "not_found", "msg": "no user key route here"}, False),  # words alone: shown
])
def test_a_refused_key_is_known_by_vasts_code_not_its_words(vast, mocked, status, body, says_key):
    mocked.post(f"{BASE}/api/v0/bundles/", status=status, json=body)
    with pytest.raises(ProviderRejected) as info:
        vast.search_offers(OfferQuery(gpu_names=["RTX 4090"]))
    assert ("VAST_API_KEY" in str(info.value)) is says_key and body["msg"] in str(info.value)


@pytest.mark.parametrize("answer", [
    pytest.param({"status": 400, "body": "r" * 185 + f" api_key={KEY} and more"}, id="plain-text-400"),
    pytest.param({"status": 400, "json": {"error": "bad", "msg": "q" * 190 + f" Bearer {KEY} echoed"}}, id="json-msg"),
    pytest.param({"status": 503, "body": "s" * 190 + f" {KEY}"}, id="retried-503"),
    pytest.param({"status": 400, "json": ["t" * 192, KEY]}, id="json-list"),
])
def test_an_error_that_echoes_the_request_never_carries_any_part_of_the_key(vast, mocked, answer):
    mocked.get(f"{BASE}/api/v0/instances/3/", **answer)
    with pytest.raises(ProviderError) as info:
        vast.show_instance(3)
    assert KEY[:6] not in str(info.value) and "***" in str(info.value)


def test_other_bearer_tokens_in_an_answer_are_masked(vast, mocked):
    mocked.get(f"{BASE}/api/v0/instances/3/", status=400, body="proxy saw Authorization: Bearer other-token-xyz")
    with pytest.raises(ProviderError) as info:
        vast.show_instance(3)
    assert "other-token-xyz" not in str(info.value) and "Bearer ***" in str(info.value)


def test_redirects_are_not_followed_with_the_key(vast, mocked):
    mocked.get(f"{BASE}/api/v1/instances/", status=302, headers={"Location": "https://elsewhere.test/x"})
    with pytest.raises(ProviderError, match="redirect"):
        vast.list_instances()
    assert len(mocked.calls) == 1


# --- single-instance calls ----------------------------------------------------------------------------


def test_show_instance(vast, mocked):
    mocked.get(f"{BASE}/api/v0/instances/42/", json={"instances": instance(42, status_msg=" ok \n")})
    mocked.get(f"{BASE}/api/v0/instances/43/", json={"instances": None})
    shown = vast.show_instance(42)
    assert shown.id == 42 and shown.status_msg == "ok"
    assert vast.show_instance(43) is None
    assert query_of(mocked.calls[0]) == {"owner": "me"}
    assert_clean(mocked.calls[0])


def test_show_instance_without_the_key_is_an_error(vast, mocked):
    mocked.get(f"{BASE}/api/v0/instances/42/", json={"success": True})
    with pytest.raises(ProviderError):
        vast.show_instance(42)


def test_stop_start_requests(vast, mocked):
    url = f"{BASE}/api/v0/instances/9/"
    mocked.put(url, json={"success": True})
    vast.stop_instance(9)
    vast.start_instance(9)
    assert [body_of(call) for call in mocked.calls] == [{"state": "stopped"}, {"state": "running"}]
    for call in mocked.calls:
        assert call.request.method == "PUT" and urlparse(call.request.url).path == "/api/v0/instances/9/"
        assert_clean(call)


def test_success_false_on_200_is_an_error(vast, mocked):
    mocked.put(f"{BASE}/api/v0/instances/9/", json={"success": False, "error": "missing_billing", "msg": "no card"})
    with pytest.raises(ProviderRejected, match="no card"):
        vast.stop_instance(9)


def test_destroy(vast, mocked):
    mocked.delete(f"{BASE}/api/v0/instances/9/", json={"success": True})
    vast.destroy_instance(9)
    call = mocked.calls[0]
    assert call.request.method == "DELETE" and urlparse(call.request.url).path == "/api/v0/instances/9/"
    assert body_of(call) == {}
    assert_clean(call)


def test_destroy_of_a_gone_instance_counts_as_destroyed(vast, mocked):
    mocked.delete(f"{BASE}/api/v0/instances/9/", status=404,
                  json={"success": False, "error": "no_such_instance", "msg": "not found"})
    mocked.get(f"{BASE}/api/v0/instances/9/", json={"instances": None})
    assert vast.destroy_instance(9) is None  # no error: vast has no such instance, so it is destroyed
    assert [(c.request.method, urlparse(c.request.url).path) for c in mocked.calls] == [
        ("DELETE", "/api/v0/instances/9/"), ("GET", "/api/v0/instances/9/")]  # confirmed by a show, once


def test_destroy_refused_while_instance_still_exists_raises(vast, mocked):
    mocked.delete(f"{BASE}/api/v0/instances/9/", json={"success": False, "msg": "try later"})
    mocked.get(f"{BASE}/api/v0/instances/9/", json={"instances": instance(9)})
    with pytest.raises(ProviderError):
        vast.destroy_instance(9)


def test_destroy_unreachable_raises(vast, mocked, sleeps):
    mocked.delete(f"{BASE}/api/v0/instances/9/", status=502, body="bad gateway")
    with pytest.raises(ProviderError):
        vast.destroy_instance(9)


# --- offers and create --------------------------------------------------------------------------------


def test_offer_search_body(vast, mocked):
    mocked.post(f"{BASE}/api/v0/bundles/", json={"offers": [
        {"id": 2, "machine_id": 20, "gpu_name": "RTX 5090", "num_gpus": 1, "dph_total": 0.7, "cpu_ram": 515000,
         "inet_down": 900.0, "reliability": 0.995},
        {"id": 1, "machine_id": 10, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.4, "cpu_ram": 257000,
         "inet_down": 700.0, "reliability": 0.99},
        {"id": "junk"},
    ]})
    offers = vast.search_offers(OfferQuery(gpu_names=["RTX 4090", "RTX 5090"], max_dph=0.8, min_cpu_ram_gb=256,
                                           min_inet_down_mbps=500, min_reliability=0.98, disk_gb=150, limit=5))
    assert [o.id for o in offers] == [1, 2]
    assert offers[0].cpu_ram_gb == 257.0 and offers[0].machine_id == 10
    call = mocked.calls[0]
    assert call.request.method == "POST" and urlparse(call.request.url).path == "/api/v0/bundles/"
    assert_clean(call)
    assert body_of(call) == {
        "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
        "gpu_name": {"in": ["RTX 4090", "RTX 5090"]}, "dph_total": {"lte": 0.8}, "cpu_ram": {"gte": 256000},
        "inet_down": {"gte": 500}, "reliability": {"gte": 0.98}, "order": [["dph_total", "asc"]],
        "type": "on-demand", "limit": 5, "allocated_storage": 150.0,
    }


def test_offer_search_single_gpu_and_by_id(vast, mocked):
    mocked.post(f"{BASE}/api/v0/bundles/", json={"offers": []})
    vast.search_offers(OfferQuery(gpu_names=["RTX 4090"]))
    vast.search_offers(OfferQuery(offer_id=77, disk_gb=100))
    assert body_of(mocked.calls[0])["gpu_name"] == {"eq": "RTX 4090"}
    by_id = body_of(mocked.calls[1])
    assert by_id["id"] == {"eq": 77} and "gpu_name" not in by_id and by_id["allocated_storage"] == 100.0


def test_offer_search_without_offers_key_raises(vast, mocked):
    mocked.post(f"{BASE}/api/v0/bundles/", json={"success": True})
    with pytest.raises(ProviderError):
        vast.search_offers(OfferQuery())


def test_create_request(vast, mocked):
    mocked.put(f"{BASE}/api/v0/asks/555/", json={"success": True, "new_contract": 7835610})
    assert vast.create_instance(create_request()) == 7835610
    call = mocked.calls[0]
    assert call.request.method == "PUT" and urlparse(call.request.url).path == "/api/v0/asks/555/"
    assert_clean(call)
    assert body_of(call) == {"client_id": "me", "image": "img:1", "disk": 150.0, "label": "vastctl-abc",
                             "onstart": "echo hi", "env": {"VASTCTL_UUID": "u", "FOO": "bar"}, "runtype": "ssh",
                             "price": None, "image_login": None, "cancel_unavail": True}


@pytest.mark.parametrize("status", [404, 410])
def test_create_on_a_gone_offer(vast, mocked, status):
    mocked.put(f"{BASE}/api/v0/asks/555/", status=status,
               json={"success": False, "error": "no_such_ask", "msg": "no longer available", "ask_id": 555})
    with pytest.raises(OfferGone):
        vast.create_instance(create_request())


def test_create_refused_is_a_rejection(vast, mocked):
    mocked.put(f"{BASE}/api/v0/asks/555/", status=400, json={"success": False, "error": "invalid_args", "msg": "x"})
    with pytest.raises(ProviderRejected):
        vast.create_instance(create_request())


def test_create_is_not_retried_when_the_outcome_is_unknown(vast, mocked, sleeps):
    mocked.put(f"{BASE}/api/v0/asks/555/", body=requests.ReadTimeout("read timed out"))
    with pytest.raises(ProviderError) as info:
        vast.create_instance(create_request())
    assert not isinstance(info.value, ProviderRejected) and "unknown" in str(info.value)
    assert len(mocked.calls) == 1 and sleeps == []


def test_create_502_is_unknown_not_retried(vast, mocked, sleeps):
    mocked.put(f"{BASE}/api/v0/asks/555/", status=502, body="bad gateway")
    with pytest.raises(ProviderError) as info:
        vast.create_instance(create_request())
    assert not isinstance(info.value, ProviderRejected)
    assert len(mocked.calls) == 1


def test_create_429_is_retried(vast, mocked, sleeps):
    url = f"{BASE}/api/v0/asks/555/"
    mocked.put(url, status=429, body="slow down")
    mocked.put(url, json={"success": True, "new_contract": 9})
    assert vast.create_instance(create_request()) == 9
    assert len(sleeps) == 1


def test_create_answer_without_an_id_is_unknown(vast, mocked):
    mocked.put(f"{BASE}/api/v0/asks/555/", json={"success": True})
    with pytest.raises(ProviderError) as info:
        vast.create_instance(create_request())
    assert not isinstance(info.value, ProviderRejected)


# --- key and factory ----------------------------------------------------------------------------------


def test_key_from_env_beats_files(tmp_path):
    home = tmp_path / "h"
    (home / ".config" / "vastai").mkdir(parents=True)
    (home / ".config" / "vastai" / "vast_api_key").write_text("from-file\n")
    assert find_api_key({"HOME": str(home), "VAST_API_KEY": "from-env"}) == "from-env"
    assert find_api_key({"HOME": str(home)}) == "from-file"
    (home / ".config" / "vastai" / "vast_api_key").unlink()
    (home / ".vast_api_key").write_text("legacy")
    assert find_api_key({"HOME": str(home)}) == "legacy"
    (home / ".vast_api_key").unlink()
    assert find_api_key({"HOME": str(home)}) is None
    xdg = tmp_path / "xdg"
    (xdg / "vastai").mkdir(parents=True)
    (xdg / "vastai" / "vast_api_key").write_text("xdg")
    assert find_api_key({"HOME": str(home), "XDG_CONFIG_HOME": str(xdg)}) == "xdg"


def test_factory(monkeypatch):
    with pytest.raises(BadInput, match="VAST_API_KEY"):
        get_provider(Config(), clock=SYSTEM)
    provider = get_provider(Config(), clock=SYSTEM, env={"VAST_API_KEY": KEY, "VAST_API_URL": "http://127.0.0.1:9/"})
    assert isinstance(provider, VastProvider) and provider.base_url == "http://127.0.0.1:9"
    assert provider.clock is SYSTEM
    assert get_provider(Config(), clock=SYSTEM, env={"VAST_API_KEY": KEY}).base_url == "https://console.vast.ai"


@pytest.mark.parametrize("body", [
    pytest.param({"success": False, "error": f"bad_key_{KEY}", "msg": "invalid"}, id="error"),
    pytest.param({"error": f"{KEY}"}, id="error-alone"),
    pytest.param({"detail": f"key {KEY}"}, id="detail"),
    pytest.param({"error": {"nested": [KEY]}}, id="nested"),
])
@pytest.mark.parametrize("status", [400, 422, 404])
def test_the_key_in_any_field_of_an_error_body_is_masked(vast, mocked, body, status):
    mocked.put(f"{BASE}/api/v0/instances/3/", status=status, json=body)
    with pytest.raises(ProviderError) as info:
        vast.stop_instance(3)
    assert KEY[:6] not in str(info.value) and KEY[-6:] not in str(info.value)


def test_the_key_in_a_quota_reset_header_is_masked(vast, mocked, sleeps):
    mocked.post(f"{BASE}/api/v0/bundles/", status=429, headers={"X-RateLimit-Reset": f"never {KEY}"},
                json={"success": False, "error": "search_quota_exceeded"})
    with pytest.raises(ProviderRejected) as info:
        vast.search_offers(OfferQuery(gpu_names=["RTX 4090"]))
    assert KEY not in str(info.value) and "***" in str(info.value)
