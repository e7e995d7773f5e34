"""The operator profile database (INFless §3.3) in one SQLite file.

Three tables:
- op_profiles: operator signature, batch, CPU threads, device ("cpu" | "cuda"), GPU share
  (% of SMs, 0 on the CPU) -> mean ms. Keyed by signature, so models that share an operator
  share its profile.
- graphs: model id -> the model's operator graph (JSON, see graph.OpGraph).
- model_profiles: model id, batch, threads, device, share -> measured end-to-end ms (the
  fallback when operators are missing, and the reference for the error report).
- path_costs: node -> the serving path's own cost per batch, fixed ms + per-item ms (measured
  by `faas-gpu profile --path` on a running stack; INFless's capacity model adds it to t_exec).
- noisy_profiles: model id -> why its profile was taken on a machine too busy to trust (kept
  because there was no other; `faas-gpu up` profiles such a model again).

`faas-gpu profile` writes it while the provider reads it, from other processes: WAL mode lets
readers see each committed profile without blocking the writer.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from faas_gpu import paths

from .graph import OpGraph

DEVICES = ("cpu", "cuda")

SCHEMA = """
CREATE TABLE IF NOT EXISTS op_profiles (
    signature TEXT NOT NULL, batch INTEGER NOT NULL, threads INTEGER NOT NULL, device TEXT NOT NULL,
    share INTEGER NOT NULL, ms REAL NOT NULL, PRIMARY KEY (signature, batch, threads, device, share));
CREATE TABLE IF NOT EXISTS graphs (model TEXT PRIMARY KEY, graph TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS model_profiles (
    model TEXT NOT NULL, batch INTEGER NOT NULL, threads INTEGER NOT NULL, device TEXT NOT NULL,
    share INTEGER NOT NULL, ms REAL NOT NULL, PRIMARY KEY (model, batch, threads, device, share));
CREATE TABLE IF NOT EXISTS path_costs (
    node TEXT PRIMARY KEY, fixed_ms REAL NOT NULL, per_item_ms REAL NOT NULL, points TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS noisy_profiles (model TEXT PRIMARY KEY, note TEXT NOT NULL);
"""

Config = tuple[int, int, str, int]  # batch, threads, device, share


def profiles_db() -> Path:
    """The default store: $FAAS_GPU_HOME/profiles.db, where the provider looks for it."""
    return paths.home() / "profiles.db"


def _check(batch: int, threads: int, device: str, share: int, ms: float | None = None) -> None:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if batch < 1 or threads < 1:
        raise ValueError(f"batch and threads must be >= 1, got batch {batch}, threads {threads}")
    if not 0 <= share <= 100 or (device == "cpu") != (share == 0):
        raise ValueError(f"gpu share must be 0 on the cpu and 1..100 on cuda, got {share} on {device}")
    if ms is not None and not ms >= 0:
        raise ValueError(f"latency must be >= 0 ms, got {ms}")


class ProfileStore:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, sql: str, params: Iterable = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, tuple(params)).fetchall()

    def _write(self, sql: str, rows: list[tuple]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(sql, rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- operator profiles ------------------------------------------------------------------
    def put_ops(self, batch: int, threads: int, device: str, share: int, times: dict[str, float]) -> None:
        """Operator times (signature -> ms) measured at one configuration; replaces older ones."""
        _check(batch, threads, device, share)
        for ms in times.values():
            _check(batch, threads, device, share, ms)
        self._write(
            "INSERT OR REPLACE INTO op_profiles VALUES (?, ?, ?, ?, ?, ?)",
            [(sig, batch, threads, device, share, float(ms)) for sig, ms in times.items()],
        )

    def op_ms(self, signature: str, batch: int, threads: int, device: str = "cpu", share: int = 0) -> float | None:
        rows = self._rows(
            "SELECT ms FROM op_profiles WHERE signature=? AND batch=? AND threads=? AND device=? AND share=?",
            (signature, batch, threads, device, share),
        )
        return rows[0][0] if rows else None

    def ops_at(self, signatures: Iterable[str], batch: int, threads: int, device: str, share: int) -> dict[str, float]:
        """The profiles that exist among `signatures` at one configuration."""
        sigs = set(signatures)
        rows = self._rows(
            "SELECT signature, ms FROM op_profiles WHERE batch=? AND threads=? AND device=? AND share=?",
            (batch, threads, device, share),
        )
        return {s: ms for s, ms in rows if s in sigs}

    def op_configs(self, signatures: Iterable[str]) -> dict[Config, dict[str, float]]:
        """Every configuration at which any of `signatures` is profiled -> {signature: ms}."""
        sigs = set(signatures)
        out: dict[Config, dict[str, float]] = {}
        for sig, b, t, d, s, ms in self._rows("SELECT signature, batch, threads, device, share, ms FROM op_profiles"):
            if sig in sigs:
                out.setdefault((b, t, d, s), {})[sig] = ms
        return out

    def op_signatures(self) -> set[str]:
        return {r[0] for r in self._rows("SELECT DISTINCT signature FROM op_profiles")}

    # -- graphs -----------------------------------------------------------------------------
    def put_graph(self, model: str, graph: OpGraph) -> None:
        self._write("INSERT OR REPLACE INTO graphs VALUES (?, ?)", [(model, graph.to_json())])

    def graph(self, model: str) -> OpGraph | None:
        rows = self._rows("SELECT graph FROM graphs WHERE model=?", (model,))
        return OpGraph.from_json(rows[0][0]) if rows else None

    # -- whole-model profiles -------------------------------------------------------------------
    def put_model(self, model: str, batch: int, threads: int, device: str, share: int, ms: float) -> None:
        _check(batch, threads, device, share, ms)
        self._write(
            "INSERT OR REPLACE INTO model_profiles VALUES (?, ?, ?, ?, ?, ?)",
            [(model, batch, threads, device, share, float(ms))],
        )

    def model_ms(self, model: str, batch: int, threads: int, device: str = "cpu", share: int = 0) -> float | None:
        rows = self._rows(
            "SELECT ms FROM model_profiles WHERE model=? AND batch=? AND threads=? AND device=? AND share=?",
            (model, batch, threads, device, share),
        )
        return rows[0][0] if rows else None

    def model_profiles(self, model: str) -> dict[Config, float]:
        rows = self._rows("SELECT batch, threads, device, share, ms FROM model_profiles WHERE model=?", (model,))
        return {(b, t, d, s): ms for b, t, d, s, ms in rows}

    def forget_model(self, model: str) -> None:
        """Drop a model's graph and whole-model profiles (its operators' profiles stay: they are shared)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM graphs WHERE model=?", (model,))
            self._db.execute("DELETE FROM model_profiles WHERE model=?", (model,))
            self._db.execute("DELETE FROM noisy_profiles WHERE model=?", (model,))
            self._db.execute("COMMIT")

    def mark_noisy(self, model: str, note: str | None) -> None:
        """Record (note) or clear (None) that the model's profile was measured on a busy machine."""
        if note is None:
            self._write("DELETE FROM noisy_profiles WHERE model=?", [(model,)])
        else:
            self._write("INSERT OR REPLACE INTO noisy_profiles VALUES (?, ?)", [(model, note)])

    def noisy(self, model: str) -> str | None:
        rows = self._rows("SELECT note FROM noisy_profiles WHERE model=?", (model,))
        return rows[0][0] if rows else None

    # -- the serving path -----------------------------------------------------------------------
    def put_path_cost(self, node: str, fixed_ms: float, per_item_ms: float, points: str = "") -> None:
        """The path's cost on `node` (fixed ms per batch, ms per request) and the points it was fitted to."""
        if not (fixed_ms >= 0 and per_item_ms >= 0):
            raise ValueError(f"path cost must be >= 0 ms, got {fixed_ms}, {per_item_ms}")
        self._write("INSERT OR REPLACE INTO path_costs VALUES (?, ?, ?, ?)", [(node, fixed_ms, per_item_ms, points)])

    def path_cost(self, node: str) -> tuple[float, float] | None:
        """(fixed ms, per-item ms) measured on `node`, or None."""
        rows = self._rows("SELECT fixed_ms, per_item_ms FROM path_costs WHERE node=?", (node,))
        return (rows[0][0], rows[0][1]) if rows else None

    def models(self) -> list[str]:
        """Every model with a graph or a whole-model profile."""
        rows = self._rows("SELECT model FROM graphs UNION SELECT model FROM model_profiles ORDER BY 1")
        return [r[0] for r in rows]
