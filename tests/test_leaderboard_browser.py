"""The generated leaderboard in real headless Chromium (Debian's chromium + chromium-driver).

Without them the test skips locally and FAILS in CI (CI=true): .ci/run installs them.
The screenshot goes to pytest's tmp_path, never into the repository.
"""

import os
import shutil

import pytest
from leaderboard_db import EVIL, tiny_db

from clbench.leaderboard import build

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        message = f"headless Chromium needed: {', '.join(missing)} missing (apt-get install chromium chromium-driver)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # given explicitly, so selenium never looks for (or downloads) a browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1600",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def column(table, index):
    return [row.find_elements("tag name", "td")[index].text for row in table.find_elements("css selector", "tbody tr")]


def test_page_renders_sorts_links_provenance_and_keeps_the_injected_name_inert(browser, tmp_path):
    from selenium.common.exceptions import NoAlertPresentException

    tiny_db(tmp_path / "r.duckdb")
    out = build(tmp_path / "r.duckdb", tmp_path / "out")
    browser.get((out / "index.html").as_uri())

    # the injected name: no alert, exactly one script (the page's own), shown as text in heading, cells and plot
    with pytest.raises(NoAlertPresentException):
        _ = browser.switch_to.alert.text
    assert browser.execute_script("return document.scripts.length") == 1
    headings = [h.text for h in browser.find_elements("tag name", "h2")]
    assert headings == ["Metrics", EVIL, "arith", "Provenance", "Failed or partial runs (not in the tables)"]
    assert browser.execute_script(
        "return Array.from(document.querySelectorAll('svg text')).some(t => t.textContent.includes(arguments[0]))",
        EVIL,
    )

    # tables and plots render with real size
    sections = browser.find_elements("tag name", "section")
    arith = sections[1].find_element("css selector", "table.sortable")
    assert len(arith.find_elements("css selector", "tbody tr")) == 4
    plots = browser.find_elements("css selector", "figure.plot svg")
    assert len(plots) == 3 and all(p.size["width"] > 200 and p.size["height"] > 150 for p in plots)

    # sorting: click target_acc ↑ (ascending), again (descending), then method (text)
    headers = arith.find_elements("css selector", "thead th")
    names = [h.text for h in headers]
    acc = names.index("target_acc ↑")
    assert column(arith, acc) == ["0.6", "0.85 ± 0.07071", "0.5", "0.95"]  # generated order: method, n_train
    headers[acc].click()
    assert column(arith, acc) == ["0.5", "0.6", "0.85 ± 0.07071", "0.95"]
    headers[acc].click()
    assert column(arith, acc) == ["0.95", "0.85 ± 0.07071", "0.6", "0.5"]
    headers[names.index("n_train")].click()
    assert column(arith, names.index("n_train")) == ["50", "50", "200", "200"]

    # provenance: a row's run count links to its runs, whose ids, commit and date are listed
    link = arith.find_element("css selector", "tbody tr:first-child a")
    target = link.get_attribute("href").split("#")[1]
    link.click()
    assert browser.current_url.endswith("#" + target)
    row = browser.find_element("id", target).find_element("xpath", "./ancestor::tr")
    assert "abc123" in row.text and "2026-01-02 03:05:00" in row.text and "0.1.0" in row.text

    # failed and partial runs are listed apart with their reason
    kept = browser.find_element("css selector", "table.failed")
    assert column(kept, 0) == ["bad", "partial"]
    assert column(kept, 6) == ["diverged: loss nan at step 3", "partial: finished without metrics"]

    shot = tmp_path / "leaderboard.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
