"""The web console in headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium; nothing is downloaded) against a real node: a queue and a group made from the
page, a publish seen in the backlog, a poisoned message browsed in the DLQ, merged back
and delivered again, purged; the cluster page; the key prompt of a node with keys.
Every page is saved as a PNG under the test's tmp dir (CHERAMI_SCREENSHOTS: also there)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.server import ServerProcess, unique

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1100"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("console"), stores=1).start()
    yield proc
    proc.stop()


def wait(driver: WebDriver, what: Callable[[WebDriver], Any], timeout: float = 15) -> Any:
    # the page redraws its tables every 3 s: an element found a moment ago may be gone
    ignored = (StaleElementReferenceException, NoSuchElementException)
    return WebDriverWait(driver, timeout, 0.1, ignored_exceptions=ignored).until(what)


def text_of(css: str) -> Callable[[WebDriver], str]:
    """The text of the first element ``css`` selects, read in one step in the page."""

    def read(d: WebDriver) -> str:
        script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''"
        return str(d.execute_script(script, css))

    return read


def texts(d: WebDriver, css: str) -> list[str]:
    script = "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText)"
    return list(d.execute_script(script, css))


def click(d: WebDriver, by: str, value: str) -> None:
    """Click, finding the element again if a redraw replaced it in between."""

    def once(d: WebDriver) -> bool:
        d.find_element(by, value).click()
        return True

    wait(d, once)


def shot(driver: WebDriver, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    if os.environ.get("CHERAMI_SCREENSHOTS"):
        os.makedirs(os.environ["CHERAMI_SCREENSHOTS"], exist_ok=True)
        shutil.copy(path, os.environ["CHERAMI_SCREENSHOTS"])


def fill(driver: WebDriver, css: str, value: str) -> None:
    field = driver.find_element(By.CSS_SELECTOR, css)
    field.clear()
    field.send_keys(value)


def confirm(driver: WebDriver) -> str:
    alert = wait(driver, expected_conditions.alert_is_present())
    said = str(alert.text)
    alert.accept()
    return said


def poison(http: httpx.Client, group: str) -> str:
    """Receive one message and nack it: with max_delivery_count 1 it goes to the DLQ."""
    got: list[dict[str, Any]] = []
    while not got:
        got = http.post(group + "/receive", json={"max_messages": 1, "wait_seconds": 5}).json()[
            "messages"
        ]
    assert http.post(group + "/nack", json={"receipts": [got[0]["receipt"]]}).json()["nacked"] == 1
    return str(got[0]["body"])


def test_console_workflow(browser: WebDriver, node: ServerProcess, tmp_path: Path) -> None:
    d, q, g = browser, unique("orders"), "billing"
    http = httpx.Client(base_url=node.url, timeout=30)
    d.get(node.url + "/ui/")
    wait(d, lambda d: d.find_elements(By.ID, "queues-table"))
    assert "No queues yet" in text_of("#queues")(d)

    # a queue and a group, made from the page
    fill(d, "#new-queue-name", q)
    d.find_element(By.ID, "new-queue-submit").click()
    row = f'tr[data-queue="{q}"]'
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, row))
    assert http.get(f"/v1/queues/{q}").json()["type"] == "ap"
    assert wait(d, text_of(f'{row} [data-col="open"]')) != "0"  # its open extents
    click(d, By.LINK_TEXT, q)
    wait(d, lambda d: d.find_elements(By.ID, "groups-table"))
    fill(d, "#new-group-name", g)
    fill(d, "#new-group-max", "1")
    d.find_element(By.ID, "new-group-submit").click()
    grow = f'tr[data-group="{g}"]'
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, grow))
    assert http.get(f"/v1/queues/{q}/groups/{g}").json()["max_delivery_count"] == 1

    # publish from the page: the backlog follows
    for body in ("first", "second", "third"):
        fill(d, "#publish-body", body)
        fill(d, '#publish [name="attrs"]', f"source=console, n={body}")
        d.find_element(By.ID, "publish-submit").click()
        wait(d, lambda d: "published" in d.find_element(By.ID, "note").text)
        wait(d, lambda d: d.find_element(By.ID, "note").text.startswith("published"))
        d.execute_script("document.getElementById('note').textContent = ''")
    wait(d, lambda d: text_of(f'{grow} [data-col="backlog"]')(d) == "3")

    # poison one into the DLQ through the API; the page shows it
    group = f"/v1/queues/{q}/groups/{g}"
    poisoned = poison(http, group)
    wait(d, lambda d: text_of(f'{grow} [data-col="dlq"]')(d) == "1")
    wait(d, lambda d: text_of(f'{grow} [data-col="backlog"]')(d) == "2")
    wait(d, lambda d: text_of("#chart-rate")(d) == "")  # the charts are drawn (a canvas)
    shot(d, tmp_path, "queue")

    # browse the DLQ, merge back: delivered again to the group
    click(d, By.CSS_SELECTOR, f'{grow} [data-col="dlq"] a')
    msg = wait(d, lambda d: texts(d, "tr[data-message]"))[0]
    assert poisoned in msg and f"n={poisoned}" in msg and "source=console" in msg
    assert text_of('[data-col="deliveries"]')(d) == "1"
    shot(d, tmp_path, "dlq")
    d.find_element(By.ID, "dlq-merge").click()
    assert "Merge 1 message from the DLQ" in confirm(d)
    wait(d, lambda d: "merged 1 messages" in d.find_element(By.ID, "note").text)
    wait(d, lambda d: "The DLQ is empty" in d.find_element(By.ID, "dlq").text)
    # delivered again once the output host reads the group's extents (every second)
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + 15
    while poisoned not in [m["body"] for m in received] and time.monotonic() < deadline:
        answer = http.post(group + "/receive", json={"max_messages": 10, "wait_seconds": 2})
        received += answer.json()["messages"]
    assert poisoned in [m["body"] for m in received], received

    # poison it again and purge from the page
    receipts = [m["receipt"] for m in received if m["body"] == poisoned]
    assert http.post(group + "/nack", json={"receipts": receipts}).json()["nacked"] == 1
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-message]"))
    d.find_element(By.ID, "dlq-purge").click()
    assert "Purge 1 message from the DLQ" in confirm(d)
    wait(d, lambda d: "purged 1 messages" in d.find_element(By.ID, "note").text)
    assert http.get(group + "/dlq").json()["depth"] == 0

    # the cluster: every host alive
    d.find_element(By.ID, "nav-cluster").click()
    hosts = wait(d, lambda d: texts(d, "tr[data-host]"))
    assert len(hosts) == 5 and all("alive" in h for h in hosts)
    shot(d, tmp_path, "cluster")

    # the queues list, then edit and delete the queue from its page
    d.find_element(By.ID, "nav-queues").click()
    wait(d, text_of(f'{row} [data-col="published"]'))
    assert text_of(f'{row} [data-col="published"]')(d) == "3"
    shot(d, tmp_path, "queues")
    click(d, By.LINK_TEXT, q)
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, grow))
    fill(d, '#edit-queue [name="retention_seconds"]', "7200")
    d.find_element(By.CSS_SELECTOR, '#edit-queue button[type="submit"]').click()
    wait(d, lambda d: "updated" in d.find_element(By.ID, "note").text)
    assert http.get(f"/v1/queues/{q}").json()["retention_seconds"] == 7200
    d.find_element(By.ID, "delete-queue").click()
    assert q in confirm(d)
    wait(d, lambda d: d.find_elements(By.ID, "queues-table"))
    assert http.get(f"/v1/queues/{q}").status_code == 404
    http.close()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("keyed")
    keys = root / "keys.json"
    keys.write_text(json.dumps([
        {"key": "admin-key", "scopes": ["admin"]},
        {"key": "orders-key", "scopes": ["consume"], "prefixes": ["orders"]},
    ]))  # fmt: skip
    proc = ServerProcess(root / "node", stores=1, extra=["--auth-file", str(keys)]).start()
    yield proc
    proc.stop()


def test_key_prompt_and_what_a_key_covers(
    browser: WebDriver, keyed: ServerProcess, tmp_path: Path
) -> None:
    d = browser
    admin = {"Authorization": "Bearer admin-key"}
    with httpx.Client(base_url=keyed.url, headers=admin) as http:
        assert http.put("/v1/queues/orders-eu").status_code == 201
        assert http.put("/v1/queues/payroll").status_code == 201
    d.get(keyed.url + "/ui/")
    d.execute_script("sessionStorage.clear()")
    d.refresh()
    wait(d, lambda d: d.find_elements(By.ID, "key-prompt"))
    shot(d, tmp_path, "key-prompt")
    fill(d, "#key-input", "not-a-key")
    d.find_element(By.ID, "key-submit").click()
    wait(d, lambda d: "unknown API key" in text_of("#key-prompt")(d))
    fill(d, "#key-input", "orders-key")
    d.find_element(By.ID, "key-submit").click()
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="orders-eu"]'))
    assert not d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="payroll"]')  # not covered
    assert d.execute_script("return sessionStorage.getItem('cherami.key')") == "orders-key"
    shot(d, tmp_path, "queues-with-key")


def test_queues_a_page_at_a_time_with_a_filter(
    browser: WebDriver, node: ServerProcess, tmp_path: Path
) -> None:
    """The queues page lists 50 queues, the next 50 on More, and those whose names start
    with what the filter box holds (each keystroke lists again from the first page); a
    queue's page filters its groups alike."""
    d = browser
    names = [f"list-{i:02d}" for i in range(55)]
    with httpx.Client(base_url=node.url, timeout=30) as http:
        for name in [*names, "other-1"]:
            assert http.put(f"/v1/queues/{name}").status_code in (200, 201)
        for group in ("a1", "a2", "b1"):
            assert http.put(f"/v1/queues/other-1/groups/{group}").status_code in (200, 201)
    d.get(node.url + "/ui/")

    def shown(d: WebDriver) -> list[str]:
        return [row.split("\n")[0].split("\t")[0] for row in texts(d, "tr[data-queue]")]

    def more(d: WebDriver) -> bool:
        return bool(d.find_elements(By.ID, "queues-more"))

    wait(d, lambda d: len(shown(d)) == 50 and more(d))
    fill(d, "#queues-filter", "list-")
    wait(d, lambda d: shown(d) == names[:50] and more(d))
    assert "showing the first 50 queues" in text_of("#queues")(d)
    click(d, By.ID, "queues-more")
    wait(d, lambda d: shown(d) == names and not more(d))
    fill(d, "#queues-filter", "list-5")
    wait(d, lambda d: shown(d) == names[50:] and not more(d))
    shot(d, tmp_path, "queues-filtered")
    fill(d, "#queues-filter", "nothing")
    wait(d, lambda d: "No queue name starts with “nothing”" in text_of("#queues")(d))
    fill(d, "#queues-filter", "a b")  # no name holds a space: nothing asked of the server
    wait(d, lambda d: "No queue name starts with “a b”" in text_of("#queues")(d))
    fill(d, "#queues-filter", "oth")
    wait(d, lambda d: shown(d) == ["other-1"])
    # a queue's groups: filtered the same way
    click(d, By.LINK_TEXT, "other-1")
    groups = "tr[data-group]"
    wait(d, lambda d: len(texts(d, groups)) == 3)
    fill(d, "#groups-filter", "a")
    wait(d, lambda d: [g.split("\t")[0] for g in texts(d, groups)] == ["a1", "a2"])


def test_a_queues_page_shows_its_newest_messages_without_consuming_them(
    browser: WebDriver, node: ServerProcess, tmp_path: Path
) -> None:
    """The messages panel (GET …/messages, newest first): 20 at a time, 20 older on a
    click, and the group's backlog unchanged by it."""
    d, q = browser, unique("peek")
    with httpx.Client(base_url=node.url, timeout=30) as http:
        assert http.put(f"/v1/queues/{q}").status_code == 201
        assert http.put(f"/v1/queues/{q}/groups/g").status_code == 201
        bodies = [f"message {i:02d}" for i in range(25)]
        messages = [{"body": b, "attributes": {"n": str(i)}} for i, b in enumerate(bodies)]
        assert http.post(f"/v1/queues/{q}/messages", json={"messages": messages}).status_code == 200
        d.get(node.url + f"/ui/#/queue/{q}")
        rows = "tr[data-peeked]"

        def shown(d: WebDriver) -> list[str]:
            return [row.split("\t")[3].strip() for row in texts(d, rows)]

        wait(d, lambda d: shown(d) == bodies[::-1][:20])
        assert "n=24" in texts(d, rows)[0]
        click(d, By.ID, "messages-more")
        wait(d, lambda d: shown(d) == bodies[::-1] and not d.find_elements(By.ID, "messages-more"))
        shot(d, tmp_path, "queue-messages")
        stats = lambda _: http.get(f"/v1/queues/{q}/groups/g").json()["stats"]  # noqa: E731
        wait(d, lambda d: stats(d)["backlog"] == 25)
        assert stats(d)["delivered"] == 0 and stats(d)["in_flight"] == 0


def test_a_queues_page_lists_and_cancels_its_scheduled_messages(
    browser: WebDriver, node: ServerProcess, tmp_path: Path
) -> None:
    """The scheduled panel (GET …/scheduled): delayed messages not due yet, the first due
    first; Cancel (after a confirm) takes one out for good (DELETE …/scheduled/{id})."""
    d, q = browser, unique("sched")
    with httpx.Client(base_url=node.url, timeout=30) as http:
        assert http.put(f"/v1/queues/{q}").status_code == 201
        messages = [{"body": f"later {i}", "delay_seconds": 3600 - i} for i in range(3)]
        ids = http.post(f"/v1/queues/{q}/messages", json={"messages": messages}).json()["ids"]
        d.get(node.url + f"/ui/#/queue/{q}")
        rows = "tr[data-scheduled]"

        def shown(d: WebDriver) -> list[str]:
            found = d.find_elements(By.CSS_SELECTOR, rows)
            return [e.get_attribute("data-scheduled") for e in found]

        wait(d, lambda d: shown(d) == ids[::-1])  # the shortest delay is due first
        assert "later 2" in texts(d, rows)[0]
        click(d, By.CSS_SELECTOR, f'tr[data-scheduled="{ids[1]}"] button')
        assert f"Cancel message {ids[1]}?" in confirm(d)
        wait(d, lambda d: shown(d) == [ids[2], ids[0]])
        shot(d, tmp_path, "queue-scheduled")
        listed = http.get(f"/v1/queues/{q}/scheduled").json()["messages"]
        assert [m["id"] for m in listed] == [ids[2], ids[0]]
