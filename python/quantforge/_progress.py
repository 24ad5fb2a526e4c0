"""Progress bars for long quantforge calls: tqdm where it is installed (it
draws a widget in notebooks and a bar in terminals), a plain stderr line
otherwise. The C++ side calls make_bar(label, total, unit) and then
update_to(done) / close() on what it returns."""

import sys
import time

try:  # Debian: python3-tqdm
    from tqdm.auto import tqdm as _tqdm
except ImportError:  # pragma: no cover - depends on the machine
    _tqdm = None


class _TqdmBar:
    def __init__(self, label, total, unit):
        self._bar = _tqdm(total=total or None, desc=label, unit=unit, leave=False)

    def update_to(self, done):
        self._bar.update(done - self._bar.n)

    def close(self):
        self._bar.close()


class _PlainBar:
    """One line on stderr at most every 2 s, and one at the end."""

    def __init__(self, label, total, unit):
        self._label, self._total, self._unit = label, total, unit
        self._done = 0
        self._start = self._last = time.monotonic()

    def _line(self, final):
        elapsed = time.monotonic() - self._start
        of = f"/{self._total}" if self._total else ""
        end = " done" if final else ""
        print(f"{self._label}: {self._done}{of} {self._unit} {elapsed:.1f} s{end}", file=sys.stderr, flush=True)

    def update_to(self, done):
        self._done = done
        now = time.monotonic()
        if now - self._last >= 2.0:
            self._last = now
            self._line(False)

    def close(self):
        self._line(True)


def make_bar(label, total, unit):
    if _tqdm is not None:
        return _TqdmBar(label, total, unit)
    return _PlainBar(label, total, unit)
