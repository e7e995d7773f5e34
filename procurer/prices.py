"""The prices procurement pays: cocktail's spot series and the on-demand price it implies.

The on-demand price is the spot mean / 0.30 (PROTEAN's `assumptions.yaml`,
`simulator.on_demand_price`), so the daemon and the simulator charge the same figures.
"""

from __future__ import annotations

from pathlib import Path

from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.protean import PriceSeries
from faas_gpu.policies.protean.procurement import SPOT_SHARE_OF_ON_DEMAND

DEFAULT_SPOT_CSV = SHARED_DATA / "cocktail" / "spot.csv"


def load_prices(path: Path, column: str = "spot1", step_s: float = 60.0) -> tuple[PriceSeries, float]:
    """Cocktail's spot series ($/h, one value per `step_s`) and the on-demand price it implies."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--spot-prices: cannot read {path}: {exc.strerror or exc}") from None
    try:
        spot = PriceSeries.from_csv_text(text, column, step_s)
    except ValueError as exc:
        raise ValueError(f"--spot-prices: {path}: {exc}") from None
    return spot, spot.mean / SPOT_SHARE_OF_ON_DEMAND
