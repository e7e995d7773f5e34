"""A real headless Chromium for tests: Debian's `chromium` and `chromium-driver`, driven by Selenium.

Nothing is downloaded: the driver's path is given to Selenium (`Service`) and `SE_OFFLINE=1` keeps
Selenium Manager from looking for a browser or driver of its own. Without both binaries the tests
that need them are skipped, saying what to install (`make servers` installs them).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def require_chromium() -> None:
    """Skip the calling test, with the reason, when Debian's chromium or its driver is absent."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not (p.exists() and os.access(p, os.X_OK))]
    if missing:
        pytest.skip(f"no {' or '.join(missing)}: apt-get install chromium chromium-driver (make servers)")
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[test]')")


@contextmanager
def chromium(auth: tuple[str, str] | None = None, size: tuple[int, int] = (1400, 1100)) -> Iterator:
    """A headless Chromium WebDriver; `auth`: basic-auth credentials sent with every request the
    page makes (DevTools' extra headers), as a browser sends them once the user has logged in."""
    require_chromium()
    os.environ["SE_OFFLINE"] = "1"  # Selenium Manager must never fetch a browser or a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # tests may run as root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--window-size={size[0]},{size[1]}",
    ):
        options.add_argument(arg)
    log = os.environ.get("FAAS_GPU_CHROMEDRIVER_LOG", os.devnull)  # a file to read when a driver fails
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER), log_output=log))
    try:
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}})
        yield driver
    finally:
        driver.quit()
