"""The status page in a real headless browser: Debian's chromium and
chromium-driver through selenium, against a real brooq-master. The overview, the lists,
a job page whose payload holds markup, and that the page runs no script it did not ship.

Skipped when no chromium is installed, unless BROOQ_REQUIRE_BROWSER=1 (.ci/run sets it,
and installs the browser): there a missing browser fails the run instead of hiding it.
Screenshots go to the test's tmp_path (`--basetemp DIR` keeps them); the ones docs/
shows were taken so (docs/status-page.md).
"""

from __future__ import annotations

import json
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
            db.execute("SELECT state, attempts FROM job_all WHERE id = %s", (job_id,)).fetchone()
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
            db.execute("SELECT state FROM job_all WHERE id = %s", (tagged[0],)).fetchone()
            == ("pending",)
        ),
        what="the job pending",
    )
    wait_for(
        lambda: browser.current_url == f"{url}/dead?tag=tenant%3A42",
        what="back on the filtered list",
    )


def test_holding_and_releasing_a_job_from_its_page(
    queue: brooq.Queue,
    db: Any,
    start_master: StartMaster,
    browser: Any,
    tmp_path: Path,
) -> None:
    """Signed in, a pending job's page has a hold button: clicked, the browser is back on
    the page, which says on_hold and offers release instead; released, the job is
    pending (ready, in the counts' words) and can be held again."""
    token = "browser-token-0123456789"
    (tmp_path / "token").write_text(token)
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")},
    )
    m.wait_ready(1)
    url = base_url(m)
    job_id, _ = queue.enqueue(brooq.Job("ops.unhandled", {"n": 1}))  # no handler: it waits

    def state() -> str:
        row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
        db.commit()
        return str(row[0])

    browser.get(url + "/sign-in")
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form[action='/sign-in'] button").click()
    wait_for(lambda: browser.current_url.endswith("/actions"), what="signed in")
    page = f"{url}/jobs/{job_id}"
    browser.get(page)
    assert browser.find_element(By.ID, "standing").text.startswith("ready: ")
    assert not browser.find_elements(By.CSS_SELECTOR, f"form[action='/jobs/{job_id}/release']")
    browser.find_element(By.CSS_SELECTOR, f"form[action='/jobs/{job_id}/hold'] button").click()
    wait_for(lambda: state() == "on_hold", what="the job on hold")
    wait_for(
        lambda: browser.find_element(By.ID, "standing").text.startswith("on_hold: on hold since"),
        what="the page saying on_hold",
    )
    assert browser.current_url == page
    assert "never claimed until released" in browser.find_element(By.ID, "standing").text
    assert not browser.find_elements(By.CSS_SELECTOR, f"form[action='/jobs/{job_id}/hold']")
    browser.save_screenshot(str(tmp_path / "job-on-hold.png"))
    browser.find_element(By.CSS_SELECTOR, f"form[action='/jobs/{job_id}/release'] button").click()
    wait_for(lambda: state() == "pending", what="the job pending")
    wait_for(
        lambda: browser.find_element(By.ID, "standing").text.startswith("ready: "),
        what="the page saying ready",
    )
    assert browser.current_url == page
    raw = browser.find_element(By.CSS_SELECTOR, "details.raw summary")
    raw.click()
    state_row = browser.find_element(By.XPATH, "//details[@class='raw']//tr[th='state']/td")
    assert state_row.text == "pending"
    assert browser.find_elements(By.CSS_SELECTOR, f"form[action='/jobs/{job_id}/hold']")
    assert token not in browser.page_source


def test_pausing_and_resuming_a_stored_schedule_from_the_schedules_page(
    queue: brooq.Queue,
    db: Any,
    start_master: StartMaster,
    browser: Any,
    tmp_path: Path,
) -> None:
    """Signed in, the schedules page (in the header's links) lists a stored schedule with
    a pause button: clicked, the browser is back on the page, which says paused and offers
    resume instead; resumed, the schedule has its next tick again."""
    token = "browser-token-0123456789"
    (tmp_path / "token").write_text(token)
    queue.add_schedule("browser-tick", "ops.unhandled", {"n": 1}, every="1h")
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")},
    )
    m.wait_ready(1)
    url = base_url(m)

    def paused() -> bool:
        row = db.execute("SELECT paused FROM brooq_schedule WHERE name = 'browser-tick'")
        found = row.fetchone()
        db.commit()
        return bool(found[0])

    def cells() -> list[str]:
        row = browser.find_element(By.XPATH, "//tr[td[1]='browser-tick']")
        return [td.text for td in row.find_elements(By.TAG_NAME, "td")]

    browser.get(url + "/sign-in")
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form[action='/sign-in'] button").click()
    wait_for(lambda: browser.current_url.endswith("/actions"), what="signed in")
    browser.find_element(By.CSS_SELECTOR, "header a[href='/schedules']").click()
    wait_for(lambda: browser.current_url == url + "/schedules", what="the schedules page")
    assert cells()[1:4] == ["every 3600s", "UTC", "ops.unhandled"]
    assert cells()[6] != "paused"
    pause = "form[action='/schedules/browser-tick/pause'] button"
    resume = "form[action='/schedules/browser-tick/resume'] button"
    assert not browser.find_elements(By.CSS_SELECTOR, resume)
    browser.find_element(By.CSS_SELECTOR, pause).click()
    wait_for(paused, what="the schedule paused")
    wait_for(lambda: cells()[6] == "paused", what="the page saying paused")
    assert browser.current_url == url + "/schedules"
    assert not browser.find_elements(By.CSS_SELECTOR, pause)
    browser.save_screenshot(str(tmp_path / "schedule-paused.png"))
    browser.find_element(By.CSS_SELECTOR, resume).click()
    wait_for(lambda: not paused(), what="the schedule resumed")
    wait_for(lambda: cells()[6] not in ("paused", ""), what="the page showing its next tick")
    assert browser.current_url == url + "/schedules"
    assert browser.find_elements(By.CSS_SELECTOR, pause)
    assert token not in browser.page_source


def test_unblocking_a_dead_key_from_the_blocked_keys_page(
    queue: brooq.Queue,
    db: Any,
    start_master: StartMaster,
    browser: Any,
    tmp_path: Path,
) -> None:
    """Signed in, the blocked keys page (in the header's links) lists an ordered key a
    dead job blocks, with an unblock button: clicked, the browser is back on the page,
    which names the key's next job, now pending, and lists no blocked key; the dead job
    stays dead."""
    token = "browser-token-0123456789"
    (tmp_path / "token").write_text(token)
    m = start_master(
        workers=1,
        app="brooq_opsslow:queue",
        env={"QUEUE_ADMIN_TOKEN_FILE": str(tmp_path / "token")},
    )
    m.wait_ready(1)
    url = base_url(m)
    # No handler takes ops.unhandled: the key's first job is made dead by hand, the second
    # waits its turn, and once unblocked stays pending.
    jobs = [brooq.Job("ops.unhandled", {"n": n}, ordering_key="browser/key 1") for n in (1, 2)]
    ids = [i for i, _ in queue.enqueue_many(jobs)]
    db.execute("UPDATE job SET state = 'dead', attempts = 1 WHERE id = %s", (ids[0],))
    db.commit()

    def states() -> list[str]:
        found = dict(db.execute("SELECT id, state FROM job_all WHERE id = ANY(%s)", (ids,)))
        db.commit()
        return [found[i] for i in ids]

    assert states() == ["dead", "waiting"]
    browser.get(url + "/sign-in")
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form[action='/sign-in'] button").click()
    wait_for(lambda: browser.current_url.endswith("/actions"), what="signed in")
    browser.find_element(By.CSS_SELECTOR, "header a[href='/keys']").click()
    wait_for(lambda: browser.current_url == url + "/keys", what="the blocked keys page")
    row = browser.find_element(By.XPATH, "//tr[td[2]='browser/key 1']")
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[:5] == ["ops.unhandled", "browser/key 1", "dead", str(ids[0]), "default"]
    assert cells[6:8] == ["—", "1"]
    browser.save_screenshot(str(tmp_path / "keys-blocked.png"))
    row.find_element(By.CSS_SELECTOR, "form[action='/keys/unblock'] button").click()
    wait_for(lambda: states() == ["dead", "pending"], what="the key's next job pending")
    wait_for(
        lambda: browser.current_url == f"{url}/keys?unblocked={ids[1]}", what="back on the page"
    )
    note = browser.find_element(By.ID, "unblocked")
    assert note.text.startswith("Unblocked: the key's next job")
    assert note.find_element(By.TAG_NAME, "a").get_attribute("href") == f"{url}/jobs/{ids[1]}"
    assert browser.find_element(By.ID, "empty").text.startswith("No key is blocked")
    assert not browser.find_elements(By.CSS_SELECTOR, "form[action='/keys/unblock']")
    assert token not in browser.page_source


SHOTS = os.environ.get("BROOQ_SCREENSHOTS")  # a folder: the docs' screenshots, taken again


def shot(browser: Any, tmp_path: Path, name: str) -> None:
    """The page as shown, to the test's folder and, with BROOQ_SCREENSHOTS set, to that
    folder (docs/screenshots: docs/status-page.md says how they are made)."""
    browser.save_screenshot(str(tmp_path / name))
    if SHOTS:
        browser.save_screenshot(str(Path(SHOTS) / name))


def seed_history(db: Any) -> dict[str, Any]:
    """An hour of work as the table keeps it: done jobs every few seconds, failures with
    their tracebacks, a growing backlog, jobs being processed, and a dead job in a graph
    (a done job upstream, a waiting one downstream)."""
    db.execute(
        "INSERT INTO job (topic, queue, state, attempts, available_at, updated_at, created_at) "
        "SELECT CASE WHEN g % 3 = 0 THEN 'img.resize' ELSE 'mail.send' END, 'default', 'done', "
        "       1, t - make_interval(secs => 1 + (g % 7) * (1 + (g % 60 < 20)::int * 4)), t, "
        "       t - interval '20 seconds' "
        "FROM (SELECT g, now() - make_interval(secs => g) AS t "
        "      FROM generate_series(5, 3600, 3) g) AS s "
        "WHERE g % 900 > 60 * (g / 900)"
    )
    db.execute(
        "INSERT INTO job (topic, queue, state, attempts, available_at, updated_at, errors, "
        "                 last_error) "
        "SELECT 'img.resize', 'default', CASE WHEN g % 4 = 0 THEN 'dead' ELSE 'done' END, 2, "
        "       now() - make_interval(secs => g * 60 + 30), now() - make_interval(secs => g * 60), "
        "       jsonb_build_array(jsonb_build_object('attempt', 1, "
        "           'at', now() - make_interval(secs => g * 60 + 10), "
        "           'started_at', now() - make_interval(secs => g * 60 + 10 + (g % 5) * 2 + 1), "
        "           'worker', 'web-1:4242:a', 'error', 'TimeoutError: upstream took too long', "
        "           'kind', 'raised', 'traceback', 'Traceback (most recent call last):\n  ...')), "
        "       'TimeoutError: upstream took too long' "
        "FROM generate_series(1, 55, 2) g"
    )
    db.execute(
        "INSERT INTO job (topic, queue, state, available_at) "
        "SELECT 'report.build', 'default', 'pending', now() - make_interval(secs => g * 20) "
        "FROM generate_series(1, 90) g"
    )
    db.execute(
        "INSERT INTO job (topic, queue, state, attempts, available_at, updated_at, locked_by, "
        "                 locked_until, progress, progress_message) "
        "SELECT 'report.build', 'default', 'processing', 1, "
        "       now() - make_interval(secs => 20 + g * 9), now() - make_interval(secs => g * 5), "
        "       'web-1:' || (4240 + g) || ':a', now() + interval '1 hour', g / 4.0, 'rendering' "
        "FROM generate_series(1, 3) g"
    )
    up, dead, down = (
        "0190a4f2-7c1e-7000-8000-00000000000a",
        "0190a4f2-7c1e-7000-8000-00000000000b",
        "0190a4f2-7c1e-7000-8000-00000000000c",
    )
    entries = [
        {
            "attempt": n,
            "at": f"2026-12-04T10:0{n}:05.5+00:00",
            "started_at": f"2026-12-04T10:0{n}:01.25+00:00",
            "worker": f"web-{n}:{4240 + n}:a",
            "error": "ConnectionError: the image store refused <b>the upload</b>",
            "kind": "raised" if n < 3 else "timeout",
            "traceback": "Traceback (most recent call last):\n"
            '  File "app/images.py", line 42, in resize\n'
            "    store.put(key, data)\n"
            f"ConnectionError: the image store refused <b>the upload</b> ({n})",
        }
        for n in (1, 2, 3)
    ]
    db.execute(
        "INSERT INTO job (id, topic, queue, state, attempts, payload, tags, group_key, "
        "                 priority, updated_at, errors, last_error) VALUES "
        "(%s, 'img.fetch', 'default', 'done', 1, '{}', NULL, NULL, 0, now(), NULL, NULL), "
        "(%s, 'img.resize', 'default', 'dead', 3, %s, ARRAY['tenant:42', 'eu'], 'tenant-42', "
        " 5, now() - interval '3 minutes', %s, 'ConnectionError: the image store refused'), "
        "(%s, 'img.publish', 'default', 'waiting', 0, '{}', NULL, NULL, 0, now(), NULL, NULL)",
        (
            up,
            dead,
            json.dumps({"image": "cat.png", "sizes": [64, 128, 512], "note": "<i>hi</i>"}),
            json.dumps(entries),
            down,
        ),
    )
    db.execute("UPDATE job SET upstream_open = 1 WHERE id = %s", (down,))
    db.execute(
        "INSERT INTO brooq_job_edge (upstream_id, downstream_id, position) "
        "VALUES (%s, %s, 1), (%s, %s, 1)",
        (up, dead, dead, down),
    )
    db.commit()
    return {"up": up, "dead": dead, "down": down}


def test_charts_the_job_page_the_search_and_the_not_found_page_in_a_browser(
    queue: brooq.Queue, db: Any, start_master: StartMaster, browser: Any, tmp_path: Path
) -> None:
    m = start_master(workers=1, app="brooq_opsslow:queue")
    m.wait_ready(1)
    url = base_url(m)
    ids = seed_history(db)
    browser.set_window_size(1280, 1000)
    # The overview: the counts in their order, the last hour's charts with points.
    browser.get(url + "/")
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "main table th")]
    counts = ["waiting", "scheduled", "ready", "held", "retrying", "parked", "on_hold",
              "processing", "dead"]  # fmt: skip
    assert [h.lower() for h in headers[2:11]] == counts, headers
    for name in ("failures", "backlog", "pickup"):
        points = browser.find_elements(By.CSS_SELECTOR, f"#chart-{name} svg circle.pt")
        assert points, name
    assert not browser.find_elements(By.TAG_NAME, "script")
    shot(browser, tmp_path, "status-overview.png")
    # The charts page, per topic, over the hour and the day.
    browser.get(url + "/charts?topic=img.resize")
    for name in ("throughput", "failures", "run"):
        svg = browser.find_element(By.CSS_SELECTOR, f"#chart-{name} svg")
        assert svg.is_displayed() and svg.find_elements(By.CSS_SELECTOR, "circle.pt"), name
    browser.get(url + "/charts")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-backlog circle.pt")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-pickup circle.pt")
    shot(browser, tmp_path, "status-charts.png")
    browser.find_element(By.CSS_SELECTOR, "select[name='window'] option[value='day']").click()
    browser.find_element(By.CSS_SELECTOR, "form.filter button").click()
    wait_for(lambda: "window=day" in browser.current_url, what="the day's charts")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-throughput circle.pt")
    # The search box in the header finds the dead job.
    field = browser.find_element(By.CSS_SELECTOR, "header input[name='id']")
    field.send_keys(f"  {ids['dead']} ")
    browser.find_element(By.CSS_SELECTOR, "header form button").click()
    wait_for(lambda: browser.current_url == f"{url}/jobs/{ids['dead']}", what="the job page")
    # Its standing, its attempts as a timeline, each traceback a click away.
    browser.set_window_size(1280, 1500)
    standing = browser.find_element(By.ID, "standing").text
    assert standing.startswith("dead: given up at ") and "after 3 attempt(s)" in standing
    attempts = browser.find_elements(By.CSS_SELECTOR, "ol.timeline li")
    assert len(attempts) == 3
    assert "attempt 1: raised" in attempts[0].text and "after 4s" in attempts[0].text
    assert (
        "attempt 3: dead" in attempts[2].text and "host web-3, child pid 4243" in attempts[2].text
    )
    trace = attempts[0].find_element(By.CSS_SELECTOR, "details.traceback pre")
    assert not trace.is_displayed()
    attempts[0].find_element(By.CSS_SELECTOR, "details.traceback summary").click()
    wait_for(trace.is_displayed, what="the traceback shown")
    assert 'File "app/images.py", line 42' in trace.text
    assert "<b>the upload</b>" in trace.text  # markup shown as text
    assert not browser.find_elements(By.CSS_SELECTOR, "main b")
    # The graph: both neighbours drawn, each a link to its page.
    nodes = browser.find_elements(By.CSS_SELECTOR, "svg#graph a.node")
    assert len(nodes) == 2
    # Every field of the row, behind its toggle.
    raw = browser.find_element(By.CSS_SELECTOR, "details.raw table")
    assert not raw.is_displayed()
    shot(browser, tmp_path, "status-job.png")
    browser.find_element(By.CSS_SELECTOR, "details.raw summary").click()
    wait_for(raw.is_displayed, what="the raw fields shown")
    assert "group_key" in raw.text and "tenant-42" in raw.text
    browser.execute_script("arguments[0].scrollIntoView()", nodes[0])
    nodes[0].click()
    wait_for(lambda: browser.current_url == f"{url}/jobs/{ids['up']}", what="the upstream job")
    assert browser.find_element(By.ID, "standing").text.startswith("done")
    # A wrong address and an unknown id: the not-found page, with the way on.
    browser.set_window_size(1280, 1000)
    for target in ("/nowhere/at/all", "/jobs/0190a4f2-7c1e-7000-8000-0000000000ff"):
        browser.get(url + target)
        assert browser.title.startswith("Not found"), target
        assert browser.find_element(By.CSS_SELECTOR, "header input[name='id']")
        links = {a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "a")}
        for path in ("/", "/in-flight", "/failed", "/dead", "/charts", "/fleet"):
            assert f"{url}{path}" in links, (target, path)
    shot(browser, tmp_path, "status-not-found.png")
    browser.get(url + "/find?id=not-a-job")
    assert browser.title.startswith("Not found") and "not-a-job" in browser.page_source
