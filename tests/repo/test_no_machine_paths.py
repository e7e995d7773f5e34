"""No tracked file names the absolute home of one machine: data beside the checkout is found
through `faas_gpu.paths.SHARED_DATA`, so a fresh clone anywhere runs the same way (the harmony
tests once passed only because one machine had the folder they named)."""

from __future__ import annotations

import re
import subprocess

from faas_gpu.paths import REPO_ROOT

# built from parts, so this file does not match itself
MACHINE_HOME = re.compile(r"(?<![\w.~}-])/(" + "|".join(("wo" + "rk", "ro" + "ot", "Us" + "ers")) + r")/")
CONTAINER_FILES = ("Dockerfile",)  # the app folder there is the image's own (OpenFaaS templates)
# /home/app is OpenFaaS's function home inside an image and a replica's sandbox, no machine's
HOME = re.compile(r"(?<![\w.~-])/ho" + r"me/(?!app\b)")


def _tracked_text_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, out.decode().split("\0")):
        path = REPO_ROOT / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary or gone from the working tree
        yield name, text


def test_no_tracked_file_names_an_absolute_home_of_a_machine():
    found = []
    for name, text in _tracked_text_files():
        for n, line in enumerate(text.splitlines(), 1):
            if MACHINE_HOME.search(line) or (HOME.search(line) and not name.endswith(CONTAINER_FILES)):
                found.append(f"{name}:{n}: {line.strip()[:120]}")
    assert not found, "absolute machine paths (use faas_gpu.paths.SHARED_DATA):\n" + "\n".join(found)


def test_the_guard_sees_such_a_path():
    assert MACHINE_HOME.search('DATA = Path("/' + 'work/shared/data/x")')
    assert HOME.search("/" + "home/someone/data") and not MACHINE_HOME.search("/var/openfaas/secrets")
    assert not HOME.search("HOME=/" + "home/app") and HOME.search("/" + "home/apple/x")
    assert not MACHINE_HOME.search("/proc/{pid}/" + "root/") and MACHINE_HOME.search("cd /" + "root/x")
