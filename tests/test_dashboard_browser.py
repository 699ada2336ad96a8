"""The dashboard in a real browser: Debian's chromium, driven by Playwright, against a real `vastctl serve`.

.ci/run installs chromium; Playwright never downloads a browser of its own.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import uuid as uuid_module
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from helpers.serving import ADMIN_TOKEN, Manager

from vastctl import clock
from vastctl.facts import demand
from vastctl.state import db, lifecycle

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
# What this machine's chromium needs as root, headless, with no network but loopback.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
XSS = "<img src=x onerror=alert(1)>"
REFRESH_WAIT_MS = 15_000  # the page refreshes every 5 s

pytestmark = [pytest.mark.slow,  # a real serve and a real browser
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium: apt-get install chromium")]


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    m = Manager(tmp_path_factory.mktemp("dashboard"), gate=40).start(0)
    yield m
    assert m.stop() == 0


@pytest.fixture(scope="module")
def chromium():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium):
    context = chromium.new_context()
    page = context.new_page()
    page.dialogs = []
    page.console_errors = []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    page.on("console", lambda message: message.type == "error" and page.console_errors.append(message.text))
    yield page
    context.close()


def sign_in(page, manager):
    page.goto(manager.url + "/")
    page.fill('input[name="token"]', ADMIN_TOKEN)
    page.click('#signin-form button[type="submit"]')
    page.wait_for_selector("#fleet")


def register(manager, label: str) -> str:
    uuid = f"u-{uuid_module.uuid4()}"
    response = requests.post(f"{manager.url}/v1/instances/{uuid}/register", json={"label": label, "gpu_name": "RTX 4090"},
                             headers={"Authorization": f"Bearer {manager.token(uuid)}"}, timeout=10)
    assert response.status_code == 200, response.text
    return uuid


def empty_queue(manager) -> None:
    conn = db.connect(manager.db_path, now=clock.SYSTEM.now())
    try:
        demand.report(conn, 0, None, now=clock.SYSTEM.now())
    finally:
        conn.close()


def target(manager) -> float | None:
    conn = sqlite3.connect(manager.db_path)
    try:
        row = conn.execute("SELECT value FROM settings WHERE key = 'target_proofs_per_hour'").fetchone()
        return None if row is None else float(row[0])
    finally:
        conn.close()


def fleet_labels(page) -> list[str]:
    return page.locator("#fleet tbody tr td:first-child").all_inner_texts()


def test_sign_in_and_see_a_machine_appear_without_a_reload(page, manager):
    page.goto(manager.url + "/")
    assert page.locator('input[name="token"]').get_attribute("type") == "password"
    sign_in(page, manager)
    assert "token" not in page.url and ADMIN_TOKEN not in page.url
    page.evaluate("window.stillTheSamePage = true")
    label = f"vastctl-appears-{uuid_module.uuid4().hex[:6]}"
    register(manager, label)
    page.wait_for_selector(f'#fleet tr[data-label="{label}"]', timeout=REFRESH_WAIT_MS)
    assert page.evaluate("window.stillTheSamePage") is True  # swapped in by the script, not a reload
    assert "updated" in page.inner_text("#refreshed")
    row = page.locator(f'#fleet tr[data-label="{label}"]').inner_text()
    assert "registered" in row and "1x RTX 4090" in row
    blocked = [text for text in page.console_errors if "Content Security Policy" in text or "Refused to" in text]
    assert blocked == []  # no script or style the content security policy blocked


def test_change_the_target_and_see_the_event(page, manager):
    sign_in(page, manager)
    form = page.locator("#set-target_proofs_per_hour")
    form.locator('input[name="value"]').fill("425")
    form.locator('button[type="submit"]').click()
    page.wait_for_selector("#flash")
    assert page.inner_text("#flash") == "target_proofs_per_hour = 425"
    assert target(manager) == 425
    assert "→ 425" in page.inner_text("#events") and "target_proofs_per_hour" in page.inner_text("#events")
    assert page.inner_text("#target") == "425"


def test_kill_a_machine_and_see_it_go(page, manager):
    label = f"vastctl-doomed-{uuid_module.uuid4().hex[:6]}"
    uuid = register(manager, label)
    empty_queue(manager)  # nothing queued: the guard lets the last machine go
    sign_in(page, manager)
    assert label in fleet_labels(page)
    page.click(f'#fleet tr[data-label="{label}"] button.kill')
    assert page.input_value('#kill-form input[name="instance"]') == label  # the row's button filled the form
    page.fill('#kill-form input[name="reason"]', "GPU errors in dmesg")
    page.click('#kill-form button[type="submit"]')
    page.wait_for_selector("#flash")
    assert page.inner_text("#flash") == f"{label} killed"
    assert label not in fleet_labels(page)
    row = manager.rows()[uuid]
    assert (row["state"], row["kill_code"], row["kill_reason"]) == ("killed", "operator", "operator: GPU errors in dmesg")
    assert "registered → killed" in page.inner_text("#events")


def report(manager, uuid: str, name: str, body: dict | None = None) -> None:
    response = requests.post(f"{manager.url}/v1/instances/{uuid}/{name}", json=body or {},
                             headers={"Authorization": f"Bearer {manager.token(uuid)}"}, timeout=10)
    assert response.status_code == 200, response.text


def queue(manager, queued: int) -> None:
    conn = db.connect(manager.db_path, now=clock.SYSTEM.now())
    try:
        demand.report(conn, queued, None, now=clock.SYSTEM.now())
    finally:
        conn.close()


def test_a_refused_kill_is_confirmed_and_forced(page, manager):
    label = f"vastctl-last-{uuid_module.uuid4().hex[:6]}"
    uuid = register(manager, label)
    for name, body in (("params-done", None), ("bench-report", {"rate": 55}), ("running", None),
                       ("heartbeat", {"proofs_done": 1})):
        report(manager, uuid, name, body)
    queue(manager, 9)  # work queued and this the only machine proving: the guard refuses its kill
    try:
        sign_in(page, manager)
        page.fill('#kill-form input[name="instance"]', label)
        page.fill('#kill-form input[name="reason"]', "GPU errors in dmesg")
        page.click('#kill-form button[type="submit"]')
        page.wait_for_selector("#flash")
        assert "never scale to zero" in page.inner_text("#flash")
        second = page.locator("#kill-override")
        assert label in second.inner_text() and "Recorded as forced" in second.inner_text()
        assert page.evaluate("document.getElementById('kill-override').checkValidity()") is False  # box unticked
        assert manager.rows()[uuid]["state"] == "running"
        second.locator('input[name="confirm"]').check()
        second.locator('button[type="submit"]').click()
        sync_api.expect(page.locator("#flash")).to_have_text(f"{label} killed (forced past the guard)")
        row = manager.rows()[uuid]
        assert (row["state"], row["kill_reason"]) == ("killed", "operator: GPU errors in dmesg (forced)")
        assert page.locator("#kill-override").count() == 0
        assert [t for t in page.console_errors if "Content Security Policy" in t or "Refused to" in t] == []
    finally:
        queue(manager, 0)


def test_a_hostile_label_is_shown_as_text(page, manager):
    register(manager, XSS)
    sign_in(page, manager)
    assert XSS in fleet_labels(page)
    sync_api.expect(page.locator("#refreshed")).to_contain_text("updated", timeout=REFRESH_WAIT_MS)  # and refreshed
    assert XSS in fleet_labels(page)
    assert page.locator("#live img").count() == 0
    page.fill('#kill-form input[name="instance"]', XSS)  # the datalist and the form carry it as text too
    assert page.dialogs == []


class _Attacker(BaseHTTPRequestHandler):
    """Another site's page with a form that posts to the dashboard (it cannot read the form token)."""

    target = ""

    def do_GET(self):
        body = (f'<!doctype html><form method="post" action="{self.target}/dashboard/settings">'
                '<input type="hidden" name="key" value="target_proofs_per_hour">'
                '<input type="hidden" name="value" value="99999">'
                '<input type="hidden" name="csrf" value="guessed">'
                '<button id="go" type="submit">win a prize</button></form>').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])  # same site on another port; another site
def test_a_forged_cross_site_post_is_refused(page, manager, host):
    sign_in(page, manager)
    before = target(manager)
    handler = type("Attacker", (_Attacker,), {"target": manager.url})
    attacker = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=attacker.serve_forever, daemon=True)
    thread.start()
    try:
        page.goto(f"http://{host}:{attacker.server_address[1]}/")
        with page.expect_navigation():
            page.click("#go")
        assert "Refused" in page.content()
        assert "another site" in page.inner_text("main")
    finally:
        attacker.shutdown()
        attacker.server_close()
    assert target(manager) == before
    page.goto(manager.url + "/")
    assert page.locator("#fleet").count() == 1  # still signed in; nothing changed


def say_vast(manager, uuid: str, status: str, message: str) -> None:
    """What reconcile records from vast's listing for a machine: its status and raw status message."""
    conn = db.connect(manager.db_path, now=clock.SYSTEM.now())
    try:
        with db.transaction(conn):
            lifecycle.update_fields(conn, uuid, {"vast_status": status, "vast_status_msg": message})
    finally:
        conn.close()


def no_sideways_scroll(page) -> dict:
    """How far the page, and each table's box, is wider than what shows (0 when nothing scrolls sideways)."""
    return page.evaluate("""() => {
        const over = {page: document.documentElement.scrollWidth - window.innerWidth};
        document.querySelectorAll('.scroll').forEach(box => {
            over[box.parentElement.id] = box.scrollWidth - box.clientWidth; });
        return over; }""")


def test_the_page_fits_820px_without_scrolling_sideways(chromium, manager):
    long_label = "vastctl-" + "a-very-long-label-" * 6
    uuid = register(manager, long_label)
    say_vast(manager, uuid, "running", "success, running nvidia/cuda:12.4.1-devel-ubuntu22.04/ssh " * 4)
    register(manager, f"{XSS}-{uuid_module.uuid4().hex[:6]}")
    context = chromium.new_context(viewport={"width": 820, "height": 900})
    page = context.new_page()
    try:
        sign_in(page, manager)
        page.wait_for_selector(f'#fleet tr[data-label="{long_label}"]')
        assert all(over <= 0 for over in no_sideways_scroll(page).values()), no_sideways_scroll(page)
        page.click(f'#fleet tr[data-label="{long_label}"] details.vastmsg summary')  # vast's message, opened
        assert all(over <= 0 for over in no_sideways_scroll(page).values()), no_sideways_scroll(page)
    finally:
        context.close()


def everything_sideways(page) -> list[str]:
    """Every box that scrolls sideways: the page, or any element wider inside than it shows and allowed to scroll."""
    return page.evaluate("""() => [...document.querySelectorAll('*')].filter(e => e.scrollWidth > e.clientWidth + 1
        && (e === document.documentElement || ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
        && e.getClientRects().length).map(e => (e.id || e.className || e.tagName) + ' ' + e.scrollWidth)""")


def text_lines(page, selector: str) -> int:
    """How many lines the text of the first element `selector` names is laid out on."""
    return page.evaluate("""selector => { const range = document.createRange();
        range.selectNodeContents(document.querySelector(selector));
        return new Set([...range.getClientRects()].map(rect => Math.round(rect.top))).size; }""", selector)


def test_a_phone_at_390px_sees_one_column_and_nothing_scrolls_sideways(chromium, manager):
    label = f"vastctl-phone-{uuid_module.uuid4().hex[:6]}"
    uuid = register(manager, label)
    say_vast(manager, uuid, "running", "success, running nvidia/cuda:12.4.1-devel-ubuntu22.04/ssh " * 4)
    queue(manager, 3)
    context = chromium.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    page = context.new_page()
    try:
        sign_in(page, manager)
        page.wait_for_selector(f'#fleet tr[data-label="{label}"]')
        assert everything_sideways(page) == []
        page.click(f'#fleet tr[data-label="{label}"] details.vastmsg summary')
        assert everything_sideways(page) == []
        # one column: the top row's cards one under the other, the forms below the live part
        boxes = page.evaluate("""() => [...document.querySelectorAll('#glance .card')].map(card => {
            const box = card.getBoundingClientRect(); return [box.left, box.top, box.width]; })""")
        assert len(boxes) == 3 and len({round(left) for left, _, _ in boxes}) == 1
        assert all(width > 300 for _, _, width in boxes) and boxes[0][1] < boxes[1][1] < boxes[2][1]
        live, aside = (page.locator(ident).bounding_box() for ident in ("#live", "#actions"))
        assert aside["y"] >= live["y"] + live["height"] - 1
        # the phone's charts, with text a phone can read; a machine's label on one line
        assert page.locator("#chart .charts.narrow").is_visible() and not page.locator("#chart .charts.wide").is_visible()
        text = page.locator("#chart .charts.narrow text.axis.y").first.bounding_box()
        assert text["height"] >= 9, text
        assert text_lines(page, f'#fleet tr[data-label="{label}"] td') == 1  # not broken mid-word
    finally:
        context.close()


def test_a_laptop_keeps_labels_whole_and_numbers_the_y_axes(chromium, manager):
    label = f"vastctl-laptop-{uuid_module.uuid4().hex[:6]}"
    register(manager, label)
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        sign_in(page, manager)
        page.wait_for_selector(f'#fleet tr[data-label="{label}"]')
        assert everything_sideways(page) == []
        assert text_lines(page, f'#fleet tr[data-label="{label}"] td') == 1
        numbers = page.locator("#chart .charts.wide svg.chart").first.locator("text.axis.y").all_text_contents()
        assert numbers[0] == "0" and len(numbers) >= 3 and all(re.fullmatch(r"[\d.]+", n) for n in numbers)
        assert page.locator("#glance-waiting").is_visible() and page.locator("#glance-money").is_visible()
    finally:
        context.close()


def test_the_charts_are_drawn_with_utc_time_ticks(page, manager):
    register(manager, f"vastctl-chart-{uuid_module.uuid4().hex[:6]}")
    queue(manager, 3)
    sign_in(page, manager)
    assert page.locator("#chart .charts.wide svg.chart").count() == 3  # the phone's three are hidden here
    assert page.locator("#chart .charts.narrow svg.chart").count() == 3
    assert not page.locator("#chart .charts.narrow").is_visible()
    drawn = page.evaluate("""() => Array.from(document.querySelectorAll('#chart polyline')).map(
        line => { const box = line.getBBox(); return [line.getAttribute('class'), box.width]; })""")
    assert {name for name, _ in drawn} >= {"line capacity", "line target", "line queue", "line spend"}
    assert {name for name, width in drawn if width > 100} >= {"line capacity", "line target", "line spend"}
    ticks = page.locator("#chart svg.chart").first.locator("text.time").all_text_contents()
    assert ticks and all(re.fullmatch(r"\d\d:\d\d", tick) for tick in ticks)
    colour = page.evaluate("getComputedStyle(document.querySelector('#chart polyline.target')).stroke")
    assert colour == "rgb(214, 39, 40)"  # the demo chart's target red, #d62728
    assert re.fullmatch(r"updated \d\d:\d\d:\d\d UTC", page.inner_text("#refreshed")) or \
        page.inner_text("#refreshed").startswith("live")


def test_vasts_hostile_message_is_text_in_a_detail_that_stays_open(page, manager):
    label = f"vastctl-msg-{uuid_module.uuid4().hex[:6]}"
    uuid = register(manager, label)
    say_vast(manager, uuid, "running", f"success, running {XSS}")
    sign_in(page, manager)
    row = page.locator(f'#fleet tr[data-label="{label}"]')
    assert XSS not in row.locator("td").nth(9).inner_text()  # `why` is vastctl's own word, not vast's
    message = row.locator("details.vastmsg .msg")
    assert not message.is_visible()  # folded away until asked for
    row.locator("details.vastmsg summary").click()
    assert message.inner_text() == f"success, running {XSS}"
    sync_api.expect(page.locator("#refreshed")).to_contain_text("updated", timeout=REFRESH_WAIT_MS)
    assert page.locator(f'#fleet tr[data-label="{label}"] details.vastmsg .msg').is_visible()  # still open
    assert re.fullmatch(r"updated \d\d:\d\d:\d\d UTC", page.inner_text("#refreshed"))
    assert page.locator("#live img").count() == 0 and page.dialogs == []


def test_a_hostile_log_tail_is_shown_as_text(page, manager):
    label = f"vastctl-says-{uuid_module.uuid4().hex[:6]}"
    uuid = register(manager, label)
    said = f"fetching\n{XSS} <script>alert(2)</script>\x1b[31mred\u202e\nend"
    response = requests.post(f"{manager.url}/v1/instances/{uuid}/log", json={"name": "fetch", "text": said},
                             headers={"Authorization": f"Bearer {manager.token(uuid)}"}, timeout=10)
    assert response.status_code == 200, response.text
    sign_in(page, manager)
    log = page.locator(f'#logs details[data-label="{label}"][data-name="fetch"]')
    log.locator("summary").click()
    shown = log.locator("pre").inner_text()
    assert shown == f"fetching\n{XSS} <script>alert(2)</script>\\x1b[31mred\\u202e\nend"
    assert page.locator("#logs img").count() == 0 and page.locator("#logs script").count() == 0
    assert page.dialogs == []
    card = page.inner_text("#cost")
    assert "spent" in card and "vast's invoice is the truth" in card
