"""`faas-gpu down`: stop the stack (the supervisor first, then whatever still runs for the state
folder), found from any folder as the other commands find it, and clear its record."""

from __future__ import annotations

import argparse

from faas_gpu import running
from faas_gpu.supervise import stop_stack


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="faas-gpu down",
        description="Stop the stack: $FAAS_GPU_HOME's, else ./.faas-gpu's, else the one `faas-gpu up` recorded.",
    ).parse_args(argv)
    located = running.locate()
    if located.home is None:
        print(f"faas-gpu was not running: {located.describe()}")
        return 0
    stopped = stop_stack(located.home)
    running.forget_stack(located.home)
    if stopped:
        print(f"faas-gpu stopped ({', '.join(stopped)}; state folder {located.home}, {located.how})")
        return 0
    print(f"faas-gpu was not running for {located.home} ({located.how})")
    others = [r.home for r in running.read_records() if r.home != located.home and running.runs(r.home)]
    for home in others:
        print(f"  a stack runs for {home}: FAAS_GPU_HOME={home} faas-gpu down")
    return 0
