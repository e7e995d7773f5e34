"""Make ResNetMini's weights (deterministic, seed 0) instead of downloading any.

Usage: python functions/classify/make_weights.py [OUT]   (default: weights.pt beside this file)
"""

import sys
from pathlib import Path

import torch

try:
    from .model import ResNetMini
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from model import ResNetMini

DEFAULT = Path(__file__).resolve().parent / "weights.pt"


def make_weights(out: Path = DEFAULT) -> Path:
    torch.manual_seed(0)
    model = ResNetMini()
    # a few forward passes in train mode give BatchNorm non-trivial running statistics
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(16, 3, 32, 32))
    tmp = out.with_suffix(".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(out)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if target.exists() and "--force" not in sys.argv:
        print(f"{target} exists")
    else:
        print(f"wrote {make_weights(target)}")
