"""`faas-gpu down`: stop the stack (the supervisor first, then whatever still runs for the state
folder)."""

from __future__ import annotations

import argparse

from faas_gpu import paths
from faas_gpu.supervise import stop_stack


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="faas-gpu down", description="Stop the stack.").parse_args(argv)
    stopped = stop_stack(paths.home())
    print(f"faas-gpu stopped ({', '.join(stopped)})" if stopped else "faas-gpu was not running")
    return 0
