"""Make ResNetMini's weights (deterministic, seed 0) instead of downloading any.

Usage: python functions/classify/make_weights.py [OUT] [--force]
(default OUT: weights.pt beside this file). The weights are random, not trained: the example
exercises the serving path (load once, batch, run), not accuracy. `*.pt` is never committed.
"""

import os
import sys
from pathlib import Path

import torch

try:
    from .model import ResNetMini
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from model import ResNetMini

DEFAULT = Path(__file__).resolve().parent / "weights.pt"
SEED = 0


def generate() -> dict[str, torch.Tensor]:
    """The state_dict for seed 0; the caller's global RNG state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = ResNetMini()
        # a few forward passes in train mode give BatchNorm non-trivial running statistics
        model.train()
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(16, 3, 32, 32))
    return model.state_dict()


def make_weights(out: Path | str = DEFAULT) -> Path:
    """Write the weights to `out` atomically (replicas starting together may race here)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        torch.save(generate(), tmp)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--force"]
    target = Path(args[0]) if args else DEFAULT
    if target.exists() and "--force" not in argv:
        print(f"{target} exists (--force to overwrite)")
    else:
        print(f"wrote {make_weights(target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
