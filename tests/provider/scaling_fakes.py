"""Stand-ins for what the provider's scaling router is handed, so its policies run tick by tick
without a runtime, a profile store or the machine's clock: the autoscaler, HarmonyBatch pools
and PROTEAN scaling tests share them."""

# batch -> ms at 1 CPU thread (2 threads: 60%); roughly a small CNN on this class of CPU
TABLE = {1: 8.0, 2: 12.0, 4: 20.0, 8: 36.0, 16: 70.0}


class TablePredictor:
    """A profile store's answers from a table: batch -> ms at one CPU thread, 60% at two."""

    def __init__(self, models):
        self.models = models

    def configs(self, model, gpu=False):
        if model not in self.models:
            raise LookupError(f"no profile for model {model!r}: run `faas-gpu profile` for it")
        return [(b, c, 0, ms * (1.0 if c == 1 else 0.6)) for b, ms in self.models[model].items() for c in (1, 2)]


class PlanRecorder:
    """A runtime that records the plans it is given and starts nothing."""

    def __init__(self):
        self.plans = {}

    def set_plan(self, namespace, name, plan):
        self.plans[(namespace, name)] = plan


class Clock:
    """A clock the test moves by setting `t`."""

    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t
