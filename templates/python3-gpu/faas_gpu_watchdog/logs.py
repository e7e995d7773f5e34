"""The watchdog's log lines: stdout, timestamped as of-watchdog's Go logger writes them."""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    sys.stdout.write(time.strftime("%Y/%m/%d %H:%M:%S ") + msg + "\n")
    sys.stdout.flush()
