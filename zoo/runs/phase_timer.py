"""Where a run's wall time went: seconds per named phase, for metrics.json's `seconds`."""

import contextlib
import time


class PhaseTimer:
    """Accumulates wall seconds per phase name; `report()` adds `total` since creation.

    >>> timer = PhaseTimer()
    >>> with timer.phase("build"):
    ...     pass
    >>> sorted(timer.report())
    ['build', 'total']
    """

    def __init__(self):
        self._start = time.perf_counter()
        self.seconds = {}

    @contextlib.contextmanager
    def phase(self, name):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def report(self):
        return {**self.seconds, "total": time.perf_counter() - self._start}
