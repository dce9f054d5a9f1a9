"""The status page in a real headless browser: Debian's chromium and
chromium-driver through selenium, against a real brooq-master. The overview, the lists,
a job page whose payload holds markup, and that the page runs no script it did not ship.

Skipped when no chromium is installed, unless BROOQ_REQUIRE_BROWSER=1 (.ci/run sets it,
and installs the browser): there a missing browser fails the run instead of hiding it.
Screenshots go to the test's tmp_path (`--basetemp DIR` keeps them); the ones docs/
shows were taken so (docs/status-page.md).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import brooq
from tests.harness import MasterProcess, StartMaster, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

if not (CHROMIUM and CHROMEDRIVER):
    if os.environ.get("BROOQ_REQUIRE_BROWSER") == "1":
        raise RuntimeError("BROOQ_REQUIRE_BROWSER=1 but chromium or chromedriver is missing")
    pytest.skip(
        "no chromium/chromedriver (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


@pytest.fixture
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def base_url(m: MasterProcess) -> str:
    found = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", m.log()), what="ops")
    return f"http://{found.group(1)}"


def fill(queue: brooq.Queue, db: Any) -> brooq.Job:
    """A few jobs of each kind the pages list, one with markup in its payload and error."""
    queue.enqueue_many([brooq.Job("ops.ok", {"n": i}) for i in range(5)])
    hostile = brooq.Job(
        "ops.unhandled", {"note": "<script>alert('owned')</script>", "q": '"quoted"'}
    )
    job_id, _ = queue.enqueue(hostile)
    db.execute(
        "UPDATE job SET state = 'dead', attempts = 3, last_error = %s, "
        "errors = jsonb_build_array(jsonb_build_object('attempt', 3, 'at', now(), "
        "'error', %s::text, 'worker', 'host:1:x')) WHERE id = %s",
        ("ValueError: <img src=x onerror=alert(1)>", "ValueError: <b>bold</b>", job_id),
    )
    db.commit()
    return job_id


def test_the_overview_the_lists_and_a_job_page_in_a_browser(
    queue: brooq.Queue, db: Any, start_master: StartMaster, browser: Any, tmp_path: Path
) -> None:
    m = start_master(workers=1, app="brooq_opsslow:queue")
    m.wait_ready(1)
    url = base_url(m)
    job_id = fill(queue, db)
    browser.get(url + "/")
    assert "brooq" in browser.title.lower()
    assert browser.find_elements(By.TAG_NAME, "table"), browser.page_source[:500]
    assert not browser.find_elements(By.TAG_NAME, "script")  # the page ships no script
    browser.save_screenshot(str(tmp_path / "overview.png"))
    # The dead list links to the job; its page shows the markup as text.
    browser.get(url + "/dead")
    link = browser.find_element(By.CSS_SELECTOR, f"a[href='/jobs/{job_id}']")
    link.click()
    wait_for(lambda: str(job_id) in browser.title or str(job_id) in browser.page_source)
    text = browser.find_element(By.TAG_NAME, "body").text
    assert "<script>alert('owned')</script>" in text  # shown, as text
    assert "<img src=x onerror=alert(1)>" in text
    assert not browser.find_elements(By.TAG_NAME, "img")  # never became an element
    assert not browser.find_elements(By.CSS_SELECTOR, "main script, main b")
    browser.save_screenshot(str(tmp_path / "job.png"))
    assert (tmp_path / "overview.png").stat().st_size > 1000


def test_signing_in_and_retrying_a_dead_job_with_its_button(
    queue: brooq.Queue,
    db: Any,
    start_master: StartMaster,
    browser: Any,
    tmp_path: Path,
) -> None:
    token = "browser-token-0123456789"
    (tmp_path / "token").write_text(token)
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")},
    )
    m.wait_ready(1)
    url = base_url(m)
    job_id = fill(queue, db)
    browser.get(url + "/sign-in")
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form[action='/sign-in'] button").click()
    wait_for(lambda: browser.current_url.endswith("/actions"), what="signed in")
    cookie = browser.get_cookie("brooq_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    # One click on the dead row's retry button; the browser comes back to the list.
    browser.get(f"{url}/dead")
    browser.find_element(By.CSS_SELECTOR, f"form[action='/jobs/{job_id}/retry'] button").click()
    wait_for(
        lambda: (
            db.execute("SELECT state, attempts FROM job WHERE id = %s", (job_id,)).fetchone()
            == ("pending", 0)
        ),
        what="the job pending",
    )
    wait_for(lambda: browser.current_url == f"{url}/dead", what="back on the dead list")
    assert not browser.find_elements(By.CSS_SELECTOR, f"a[href='/jobs/{job_id}']")
    assert token not in browser.page_source


def test_filtering_a_list_by_tag_and_coming_back_to_it_after_a_retry(
    queue: brooq.Queue,
    db: Any,
    start_master: StartMaster,
    browser: Any,
    tmp_path: Path,
) -> None:
    """The lists' tag filter is a plain GET form: typed in, submitted, the list shows the
    tagged jobs only, its links keep the tag, and a row's button comes back to the
    filtered list."""
    token = "browser-token-0123456789"
    (tmp_path / "token").write_text(token)
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")},
    )
    m.wait_ready(1)
    url = base_url(m)
    tagged = {}
    for n, tags in enumerate((["tenant:42", "eu"], ["us"], ["eu"])):
        job_id, _ = queue.enqueue(brooq.Job("ops.unhandled", {"n": n}, tags=tags))
        tagged[n] = job_id
    db.execute("UPDATE job SET state = 'dead', attempts = 1 WHERE topic = 'ops.unhandled'")
    db.commit()
    browser.get(url + "/sign-in")
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form[action='/sign-in'] button").click()
    wait_for(lambda: browser.current_url.endswith("/actions"), what="signed in")
    browser.get(url + "/dead")
    field = browser.find_element(By.CSS_SELECTOR, "form.filter input[name='tag']")
    field.send_keys("tenant:42")
    browser.find_element(By.CSS_SELECTOR, "form.filter button").click()
    wait_for(lambda: "tag=tenant" in browser.current_url, what="the filtered list")
    assert browser.current_url == f"{url}/dead?tag=tenant%3A42"
    shown = {a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "td a")}
    assert shown == {f"{url}/jobs/{tagged[0]}"}, shown
    assert "tenant:42, eu" in browser.find_element(By.TAG_NAME, "body").text
    browser.save_screenshot(str(tmp_path / "filtered.png"))
    browser.find_element(By.CSS_SELECTOR, f"form[action='/jobs/{tagged[0]}/retry'] button").click()
    wait_for(
        lambda: (
            db.execute("SELECT state FROM job WHERE id = %s", (tagged[0],)).fetchone()
            == ("pending",)
        ),
        what="the job pending",
    )
    wait_for(
        lambda: browser.current_url == f"{url}/dead?tag=tenant%3A42",
        what="back on the filtered list",
    )
