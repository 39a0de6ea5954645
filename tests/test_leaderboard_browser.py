"""The generated leaderboard in real headless Chromium (Debian's chromium + chromium-driver).

Without them the test skips locally and FAILS in CI (CI=true): .ci/run installs them.
The screenshot goes to pytest's tmp_path, never into the repository.
"""

import os
import shutil

import pytest
from leaderboard_db import EVIL, seeds_db, tiny_db

from clbench.report.leaderboard import build

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
    # the overview first, the metric legend after the results
    assert headings == [
        "Overview",
        EVIL,
        "arith",
        "The paper's tables",
        "Metrics",
        "Provenance",
        "Failed or partial runs (not in the tables)",
    ]
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
    # mean ± 95 % CI; ? : untested against the best, fft's single seed
    assert column(arith, acc) == ["0.6 ?", "0.85 ± 0.64 ?", "0.5 ?", "0.95"]  # generated order: method, n_train
    headers[acc].click()
    assert column(arith, acc) == ["0.5 ?", "0.6 ?", "0.85 ± 0.64 ?", "0.95"]
    headers[acc].click()
    assert column(arith, acc) == ["0.95", "0.85 ± 0.64 ?", "0.6 ?", "0.5 ?"]
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


def test_overview_comes_first_and_a_wide_tables_first_columns_stay_while_it_scrolls(browser, tmp_path):
    out = build(seeds_db(tmp_path / "r.duckdb").path, tmp_path / "out")
    browser.set_window_size(640, 1200)  # narrower than the words table: it must scroll sideways
    browser.get((out / "index.html").as_uri())

    assert [h.text for h in browser.find_elements("tag name", "h2")][:4] == [
        "Overview",
        "words",
        "The paper's tables",
        "Metrics",
    ]
    overview = browser.find_element("css selector", "table.overview")
    section = browser.find_element("tag name", "section")
    assert overview.location["y"] < section.location["y"]
    assert column(overview, 1) == ["et", "fft", "lora", "pt"]
    # colour by rank: the best target_loss (lora) greener than the worst (fft)
    colours = [
        c.value_of_css_property("background-color") for c in overview.find_elements("css selector", "td[data-rank]")
    ]
    assert len(set(colours)) >= 3

    board = section.find_element("css selector", "table.sortable")
    scroller = section.find_element("css selector", "div.scroll")
    assert browser.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth + 100", scroller)
    cells = board.find_elements("css selector", "tbody tr:first-child td")
    assert [c.value_of_css_property("position") for c in cells[:5]] == ["sticky"] * 4 + ["static"]
    before = [c.rect["x"] for c in cells]
    browser.execute_script("arguments[0].scrollLeft = 200", scroller)
    after = [c.rect["x"] for c in cells]
    assert after[:4] == pytest.approx(before[:4], abs=1)  # method, model, n_train, lr stay
    assert after[-1] == pytest.approx(before[-1] - 200, abs=1)  # a metric column scrolled
    # the fixed columns sit side by side, none under another
    rects = [c.rect for c in cells[:4]]
    assert all(b["x"] >= a["x"] + a["width"] - 1 for a, b in zip(rects, rects[1:]))
    assert [c.text for c in cells[:4]] == ["et", "tiny", "200", "0.01"]

    shot = tmp_path / "leaderboard-scrolled.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
