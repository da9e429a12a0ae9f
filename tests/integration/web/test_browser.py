"""The dashboard in a real browser: Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver (``.ci/run`` installs both).  One path, as a person takes it: open the
dashboard, find a dead job in the dead set, retry it, and see it succeed, a worker running.

Without the browser the test is skipped on a developer's machine, and fails under CI
(``CI=true``), where ``.ci/run`` must have installed it.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Iterator

import dramatiq
import pytest

from tests.durable import running_worker
from tests.helpers import job_of, wait_until

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: Seconds any one wait in the browser may take.
WAIT = 15


@pytest.fixture
def browser(tmp_path) -> Iterator["webdriver.Chrome"]:  # noqa: F821
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        message = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver (.ci/run does)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # As root, with no screen and no network beyond loopback: no sandbox, no GPU, and none of
    # Chromium's background connections (refused here, and slow to give up).
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-extensions", f"--user-data-dir={tmp_path / 'chromium'}",
                 "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


def test_a_person_retries_a_dead_job_and_sees_it_succeed(suite, broker, served, browser, key_prefix):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    failed_once: set[str] = set()

    @dramatiq.actor(max_retries=0, track=True)
    def import_invoices(account):
        if account not in failed_once:
            failed_once.add(account)
            raise ConnectionError("the ledger did not answer")
        return {"imported": 3}

    server = served(suite)
    base = f"http://127.0.0.1:{server.port}"
    wait = WebDriverWait(browser, WAIT)
    with running_worker(broker, threads=2):
        message = import_invoices.send(key_prefix)
        wait_until(lambda: job_of(message).status == "failed", timeout=WAIT, what="the job dies")
        job_id = job_of(message).id

        browser.get(base + "/")
        assert "Overview" in browser.title
        browser.find_element(By.LINK_TEXT, "Dead set").click()
        row = wait.until(ready.presence_of_element_located(
            (By.CSS_SELECTOR, f'#dead tr[data-job="{message.message_id}"]')))
        assert "import_invoices" in row.text and "ConnectionError: the ledger did not answer" in row.text
        row.find_element(By.CSS_SELECTOR, 'button[data-action="retry"]').click()
        notice = wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "p.notice")))
        assert "sent again" in notice.text
        assert not browser.find_elements(By.CSS_SELECTOR, f'#dead tr[data-job="{message.message_id}"]')

        browser.find_element(By.LINK_TEXT, "Jobs").click()
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, f'#jobs tr[data-job="{job_id}"] a'))).click()
        deadline = time.monotonic() + WAIT
        while (status := browser.find_element(By.ID, "job-status").text) != "succeeded":  # not live: reload
            assert time.monotonic() < deadline, f"job {job_id} did not succeed: {status}"
            time.sleep(0.2)
            browser.refresh()
        assert '"imported": 3' in browser.find_element(By.ID, "result").text
        assert len(browser.find_elements(By.CSS_SELECTOR, "#attempts tr")) >= 2  # header and attempts
    assert job_of(message).attempts == 2
