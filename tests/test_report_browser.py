"""The report page in a real browser (headless Chromium through selenium): of a small experiment with a truth
and of one without, every figure exists, is visible and its image decoded; the settings table comes first
and the timing last. Skips where Chromium or its driver is not installed (the set-up script installs them)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from enkflow.report import write_html

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SHOTS = os.environ.get("ENKFLOW_REPORT_SCREENSHOTS")  # a folder: save a screenshot of each page there

SCORES = ["fig-rmse", "fig-consistency", "fig-rank-hist", "fig-crps", "fig-obs-by-kind", "fig-inflation"]
MAPS = ["map-soil_moisture-mean", "map-soil_moisture-increment", "map-soil_moisture-spread"]


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if not (CHROMIUM.is_file() and DRIVER.is_file()):
        pytest.skip(f"{CHROMIUM} or {DRIVER} is missing: install Debian's chromium and chromium-driver (the set-up "
                    "script does)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix=f"enkflow-report-browser-{os.getpid()}-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                "--window-size=1200,900"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _check(driver: WebDriver, page: Path, figures: list[str], shot: str) -> dict[str, int]:
    driver.get(page.as_uri())
    seen = driver.execute_script(
        "return Array.from(document.querySelectorAll('figure')).map(f => {const i = f.querySelector('img');"
        " const r = i.getBoundingClientRect(); return [f.id, i.complete ? i.naturalWidth : 0, r.width, r.height];})")
    found = {fid: (natural, w, h) for fid, natural, w, h in seen}
    for fid in figures:
        assert fid in found, f"{fid} missing from {page}"
        natural, w, h = found[fid]
        assert natural > 0 and w > 0 and h > 0, f"{fid}: not decoded or not visible"
    order = driver.execute_script(
        "return Array.from(document.querySelectorAll('table#settings, figure, pre#timing-table')).map(e => e.id)")
    assert order[0] == "settings" and order[-2:] == ["timing", "timing-table"]
    if SHOTS:
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1200, min(height + 100, 16000))
        driver.save_screenshot(str(Path(SHOTS) / shot))
        driver.set_window_size(1200, 900)
    return {fid: v[0] for fid, v in found.items()}


def test_report_with_a_truth_in_chromium(browser, report_demo, tmp_path):
    d, _, _ = report_demo
    page = write_html(d / "run", tmp_path / "truth.html", truth=str(d / "truth" / "truth_{cycle:04d}.nc"))
    seen = _check(browser, page, SCORES + MAPS + ["map-soil_moisture-minus-truth", "timing"],
                  "report24-truth.png")
    assert set(seen) == set(SCORES + MAPS + ["map-soil_moisture-minus-truth", "timing"])


def test_report_without_a_truth_in_chromium(browser, report_demo, tmp_path):
    _, _, bare = report_demo
    page = write_html(bare, tmp_path / "bare.html")
    seen = _check(browser, page, SCORES + MAPS + ["timing"], "report24-no-truth.png")
    assert "map-soil_moisture-minus-truth" not in seen
    assert browser.find_element("css selector", "#fig-rmse h3").text == \
        "spread, forecast and analysis (no truth configured: no RMSE)"
