"""The status page in a real headless Chromium, over a real stack on the GPU path.

A GPU Manager (cpu back end, two units), a scheduler and the gateway share one state folder, as
`make up` runs them; the classify example is built and deployed, invoked a few times, and then
the page at /ui/ must show it: the function and its invocations, a unit with the model cached
(named by the function that uploaded it), the model's cold start (loaded, on which unit, in how
long), the scheduler's leader; its invoke form must return the
function's answer, and the page must refresh itself to count that call too.

The screenshot is saved in the test's tmp folder; with FAAS_GPU_UPDATE_FIGURES=1 it is also copied
to docs/figures/ui.png (the README's figure) when it is under 200 KB.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import requests

from faas_gpu.paths import REPO_ROOT
from tests.browser import chromium, require_chromium
from tests.daemon_process import Daemon
from tests.e2e.classify_project import build_and_deploy, classify_stack, write_project
from tests.stack_process import StackProcess

FIGURE = REPO_ROOT / "docs" / "figures" / "ui.png"
FIGURE_MAX_BYTES = 200_000


@pytest.fixture(scope="module")
def gpu_stack(tmp_path_factory):
    require_chromium()  # before minutes of build: the test is skipped without a browser
    root = tmp_path_factory.mktemp("ui-e2e")
    home = root / ".faas-gpu"
    home.mkdir()
    annotations = {"com.faas-gpu.slo-ms": "5000", "com.faas-gpu.max-batch": "4"}
    write_project(root, classify_stack("e2e/classify-gpu:latest", annotations))
    manager = Daemon("gpu_manager", home, "--units", "2", "--unit-memory-mb", "64", "--node", "local")
    scheduler = Daemon("scheduler", home)
    stack = StackProcess(home, "--scheduler", scheduler.url).start()
    try:
        build_and_deploy(root, home, stack.url)
        stack.wait_ready("classify", timeout_s=120)
        yield stack
    finally:
        stack.stop()
        scheduler.kill()
        manager.kill()


def test_the_status_page_shows_gpu_path_invocations_and_invokes(gpu_stack, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    url = f"{gpu_stack.url}/function/classify"
    answers = [requests.post(url, json={"seed": 0}, timeout=120) for _ in range(3)]
    assert all(a.status_code == 200 for a in answers), answers[0].text
    assert answers[0].headers["X-Faas-Gpu-Unit"].startswith("cpu-")  # through the scheduler and a unit
    expected = answers[0].json()

    with chromium(auth=gpu_stack.auth) as driver:
        driver.get(f"{gpu_stack.url}/ui/")
        # the page re-renders its rows as it polls: an element found a moment ago may be stale
        wait = WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,))
        row = '#functions tr[data-function="classify"]'
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"{row} .invocations"))
        assert driver.find_element(By.CSS_SELECTOR, f"{row} .invocations").text == "3"
        assert driver.find_element(By.CSS_SELECTOR, f"{row} .replicas").text == "1/1"
        # SLO attainment as the gateway tallied it (the first call, cold, may load the model past it)
        slo = requests.get(f"{gpu_stack.url}/ui/api/status", auth=gpu_stack.auth, timeout=10).json()
        met = next(f for f in slo["functions"]["items"] if f["name"] == "classify")["slo"]["met"]
        assert f"({met}/3)" in driver.find_element(By.CSS_SELECTOR, row).text and met >= 2

        # a unit of the GPU Manager, the model cached on it named by its function
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#units li.model"))
        cached = [
            u
            for u in driver.find_elements(By.CSS_SELECTOR, "#units .unit")
            if u.find_elements(By.CSS_SELECTOR, "li.model")
        ]
        assert cached, driver.find_element(By.ID, "units").text
        unit = cached[0]
        assert unit.get_attribute("data-unit").startswith("local/cpu-")
        assert "classify.openfaas-fn" in unit.find_element(By.CSS_SELECTOR, "li.model .owners").text
        assert float(unit.find_element(By.CSS_SELECTOR, "meter").get_attribute("value")) > 0
        assert "queued here: 0" in unit.text  # the scheduler answered with the cluster token
        scheduler = driver.find_element(By.ID, "scheduler").text
        assert "leader" in scheduler and "unknown" not in scheduler, scheduler
        # the model's cold start as the scheduler tells it: loaded on a unit, named by its function
        cold = "#coldstarts tr.coldstart[data-state='loaded']"
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, cold))
        loaded = driver.find_element(By.CSS_SELECTOR, cold)
        assert "classify.openfaas-fn" in loaded.find_element(By.CSS_SELECTOR, ".owners").text, loaded.text
        assert "local/cpu-" in loaded.text and float(loaded.find_element(By.CSS_SELECTOR, ".load").text) > 0

        # the invoke form answers as the function does, and the page counts that call on its own
        Select(driver.find_element(By.ID, "invoke-name")).select_by_value("classify")
        body = driver.find_element(By.ID, "invoke-body")
        body.clear()
        body.send_keys(json.dumps({"seed": 0}))
        driver.find_element(By.ID, "invoke-submit").click()
        wait.until(lambda d: d.find_element(By.ID, "invoke-status").get_attribute("data-status"))
        assert driver.find_element(By.ID, "invoke-status").get_attribute("data-status") == "200"
        assert json.loads(driver.find_element(By.ID, "invoke-output").text) == expected
        assert "on unit cpu-" in driver.find_element(By.ID, "invoke-status").text
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"{row} .invocations").text == "4")

        shot = tmp_path / "ui.png"
        driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("FAAS_GPU_UPDATE_FIGURES") == "1" and shot.stat().st_size < FIGURE_MAX_BYTES:
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, FIGURE)
