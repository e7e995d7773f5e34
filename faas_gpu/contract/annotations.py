"""Every `com.faas-gpu.*` annotation key with its rule, and the instance variables they become.

Why here: a function's annotations are read by the provider (validation at deploy and when a
record is read back, the autoscalers, the runtime that turns some into an instance's
environment), by the CLI and the profiler. Each key is spelled once; the rules (`CHECKS`) are the
ones `provider.validation` applies to a deploy, and the same rules hold for the environment
variables that override the annotations (`ENV_CHECKS`).

A rule is `(where, raw) -> None`, raising `errors.ValidationError` whose message starts with
`where` (`annotations: com.faas-gpu.slo-ms must be ...`). Pure: no clock, files or network.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from . import env
from .duration import parse_duration
from .errors import ValidationError
from .slo import MAX_SLO_MS

PREFIX = "com.faas-gpu."

SLO_MS = "com.faas-gpu.slo-ms"
MAX_BATCH = "com.faas-gpu.max-batch"
BATCH_TIMEOUT_MS = "com.faas-gpu.batch-timeout-ms"
CLASS = "com.faas-gpu.class"
MODEL = "com.faas-gpu.model"
PROTEAN_MODEL = "com.faas-gpu.protean-model"
HARMONY_MODEL = "com.faas-gpu.harmony-model"
HARMONY_STRATEGY = "com.faas-gpu.harmony-strategy"
APPS = "com.faas-gpu.apps"
BEST_EFFORT = "com.faas-gpu.best-effort"
SCALE_ZERO = "com.faas-gpu.scale-zero"
KEEP_ALIVE = "com.faas-gpu.keep-alive"
SCALING = "com.faas-gpu.scaling"
GPU = "com.faas-gpu.gpu"
MODEL_SOURCE = "com.faas-gpu.model-source"
INPUT_SHAPE = "com.faas-gpu.input-shape"
INPUT_DTYPE = "com.faas-gpu.input-dtype"
RETRY_ON_RESET = "com.faas-gpu.retry-on-reset"
"""`false` for a function whose call must never run twice: the gateway then answers 502 when a
replica drops a call it was sent, instead of sending it once more to another replica."""

SCALING_POLICIES = ("infless", "harmonybatch", "protean")
"""`com.faas-gpu.scaling`'s values (unset: harmonybatch with apps, infless with a model, else none)."""
HARMONY_STRATEGIES = ("harmony", "batch", "mbs")
"""`com.faas-gpu.harmony-strategy`'s values: HarmonyBatch's planner strategies."""
INPUT_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32")
"""`com.faas-gpu.input-dtype`'s values: the dtypes the profiler feeds a model."""
DEFAULT_KEEP_ALIVE = "lsth"
MAX_BATCH_SIZE = 1024
MAX_GPUS = 64
APP_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")  # as the provider reads app names
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][-._A-Za-z0-9]{0,252}$")

TO_ENV = {
    SLO_MS: env.SLO_MS.name,
    MAX_BATCH: env.MAX_BATCH.name,
    BATCH_TIMEOUT_MS: env.BATCH_TIMEOUT_MS.name,
    CLASS: env.CLASS.name,
    # the model's name, carried by its jobs (X-Faas-Gpu-Model) for PROTEAN's slowdown specs;
    # protean-model when the name in PROTEAN's assumptions differs from the profiled one
    MODEL: env.MODEL.name,
    PROTEAN_MODEL: env.PROTEAN_MODEL.name,
}
"""The annotations an instance receives as its GPU client's variables (faas-cli drops GPU limits)."""

Check = Callable[[str, str], None]
"""A rule for one value: (where, raw) -> None, or ValidationError naming `where`."""


def show(raw: str) -> str:
    """A value quoted for a message, cut at 40 characters."""
    return repr(raw if len(raw) <= 40 else raw[:40] + "…")


def number(lo: float, hi: float, *, lo_open: bool = True, unit: str = "") -> Check:
    def check(where: str, raw: str) -> None:
        try:
            value = float(raw.strip())
        except ValueError:
            value = math.nan
        low_ok = value > lo if lo_open else value >= lo
        if not (math.isfinite(value) and low_ok and value <= hi):
            bound = f"{'>' if lo_open else '>='} {lo:g} and <= {hi:g}"
            raise ValidationError(f"{where} must be a number{unit} {bound}, got {show(raw)}")

    return check


def integer(lo: int, hi: int, what: str = "an integer") -> Check:
    def check(where: str, raw: str) -> None:
        text = raw.strip()
        if not re.fullmatch(r"[+-]?\d{1,19}", text) or not lo <= int(text) <= hi:
            raise ValidationError(f"{where} must be {what} from {lo} to {hi}, got {show(raw)}")

    return check


def one_of(*choices: str, fold: bool = False) -> Check:
    def check(where: str, raw: str) -> None:
        value = raw.strip().lower() if fold else raw
        if value not in choices:
            raise ValidationError(f"{where} must be one of {', '.join(choices)}, got {show(raw)}")

    return check


def flag(where: str, raw: str) -> None:
    if raw.strip().lower() not in ("true", "false", "1", "0"):
        raise ValidationError(f"{where} must be true or false, got {show(raw)}")


def model_name(where: str, raw: str) -> None:
    if not MODEL_NAME_RE.match(raw.strip()):
        raise ValidationError(
            f"{where} must name a model (letters, digits, '-', '.', '_'; at most 253 characters), got {show(raw)}"
        )


def is_duration(raw: str) -> bool:
    try:
        return math.isfinite(parse_duration(raw.strip()))
    except ValueError:
        return False


def duration(where: str, raw: str) -> None:
    if not is_duration(raw):
        raise ValidationError(f"{where} must be a duration such as 10s, 1m30s or 500ms, got {show(raw)}")


def keep_alive(where: str, raw: str) -> None:
    text = raw.strip().lower()
    if text in ("lsth", "hhp"):
        return
    if not is_duration(text.removeprefix("fixed:")):
        raise ValidationError(f"{where} must be lsth, hhp or a duration (300s, fixed:5m), got {show(raw)}")


def apps(where: str, raw: str) -> None:
    """HarmonyBatch's `name=slo_ms,name=slo_ms` (the provider parses it; this bounds it)."""
    slo = number(0, MAX_SLO_MS, unit=" of milliseconds")
    seen: set[str] = set()
    for item in raw.split(","):
        name, sep, ms = item.partition("=")
        name = name.strip()
        if not sep or not APP_NAME_RE.match(name):
            raise ValidationError(f"{where} must be name=slo_ms pairs separated by commas, got {show(raw)}")
        if name in seen:
            raise ValidationError(f"{where}: app {name!r} is declared twice")
        seen.add(name)
        slo(f"{where}: SLO of app {name!r}", ms)


def shape(where: str, raw: str) -> None:
    if not re.fullmatch(r"\s*[1-9]\d{0,6}(\s*,\s*[1-9]\d{0,6}){0,7}\s*", raw):
        raise ValidationError(f"{where} must be one input's shape without the batch, like 3,32,32, got {show(raw)}")


def text(max_len: int) -> Check:
    def check(where: str, raw: str) -> None:
        if not raw.strip() or len(raw) > max_len:
            raise ValidationError(f"{where} must be non-empty text of at most {max_len} characters")

    return check


SLO_CHECK = number(0, MAX_SLO_MS, unit=" of milliseconds")
BATCH_CHECK = integer(1, MAX_BATCH_SIZE, "a whole batch size")
BATCH_TIMEOUT_CHECK = number(0, MAX_SLO_MS, lo_open=False, unit=" of milliseconds")
CLASS_CHECK = one_of("strict", "best-effort")

CHECKS: dict[str, Check] = {
    SLO_MS: SLO_CHECK,
    MAX_BATCH: BATCH_CHECK,
    BATCH_TIMEOUT_MS: BATCH_TIMEOUT_CHECK,
    CLASS: CLASS_CHECK,
    MODEL: model_name,
    PROTEAN_MODEL: model_name,
    HARMONY_MODEL: model_name,
    HARMONY_STRATEGY: one_of(*HARMONY_STRATEGIES),
    APPS: apps,
    BEST_EFFORT: flag,
    SCALE_ZERO: flag,
    KEEP_ALIVE: keep_alive,
    SCALING: one_of(*SCALING_POLICIES, fold=True),
    GPU: integer(0, MAX_GPUS, "a whole number of GPUs"),
    MODEL_SOURCE: text(1024),
    INPUT_SHAPE: shape,
    INPUT_DTYPE: one_of(*INPUT_DTYPES),
    RETRY_ON_RESET: flag,
}
"""Every `com.faas-gpu.*` key the stack reads (annotations; the same rules hold in labels).
An unknown `com.faas-gpu.*` key is refused: a typo (`slo_ms`) would otherwise be silently ignored."""

ENV_CHECKS: dict[str, Check] = {
    env.SLO_MS.name: SLO_CHECK,
    env.MAX_BATCH.name: BATCH_CHECK,
    env.BATCH_TIMEOUT_MS.name: BATCH_TIMEOUT_CHECK,
    env.CLASS.name: CLASS_CHECK,
    "read_timeout": duration,
    "write_timeout": duration,
    "exec_timeout": duration,
}
"""envVars the instance reads at start: the same rules as the annotations they override."""


def check(where: str, key: str, raw: str) -> None:
    """One `com.faas-gpu.*` key's rule; an unknown key is refused, naming the known ones."""
    rule = CHECKS.get(key)
    if rule is None:
        raise ValidationError(f"{where} is not a faas-gpu key (known: {', '.join(sorted(CHECKS))})")
    rule(where, raw)


def is_true(raw: str | None, default: bool) -> bool:
    """A validated flag's value (`flag`'s spellings); unset is `default`."""
    return default if raw is None else raw.strip().lower() in ("true", "1")
