"""A test hook: the system clock of the Python process it is loaded into, stepped by a file.

Python imports `sitecustomize` at start when this folder is on PYTHONPATH (test_clock_steps.py
puts it there). EZRA_TEST_CLOCK_FILE names a file holding seconds added to time.time() (and
time.time_ns()); the test rewrites it to step the wall clock back or forward, as an NTP step
or `date -s` does. The monotonic clocks are left alone, as such a step leaves them. A thread
reads the file and writes the offset it took to `<file>.seen`, so the test knows the step is in.
"""

import os
import threading
import time

_PATH = os.environ.get("EZRA_TEST_CLOCK_FILE")
_LOOK_EVERY = 0.01  # seconds between reads of the file

if _PATH:
    _real_time, _real_time_ns, _real_sleep = time.time, time.time_ns, time.sleep
    _offset = [0.0]

    def _stepped_time() -> float:
        return _real_time() + _offset[0]

    def _stepped_time_ns() -> int:
        return _real_time_ns() + int(_offset[0] * 1e9)

    def _follow_the_file() -> None:
        seen = None
        while True:
            try:
                with open(_PATH) as file:
                    text = file.read().strip()
            except FileNotFoundError:
                text = None  # no step asked for yet
            if text and text != seen:
                _offset[0], seen = float(text), text
                with open(_PATH + ".seen.tmp", "w") as file:
                    file.write(text)
                os.replace(_PATH + ".seen.tmp", _PATH + ".seen")
            _real_sleep(_LOOK_EVERY)

    time.time = _stepped_time
    time.time_ns = _stepped_time_ns
    threading.Thread(target=_follow_the_file, name="test clock hook", daemon=True).start()
