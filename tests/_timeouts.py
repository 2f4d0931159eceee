"""Time limits of the tests that start processes, scaled with the machine's load.

A limit is generous for an idle machine and grows with the load per core
(``os.getloadavg()[0] / os.cpu_count()``, read when the limit is taken), so a
suite run beside other work (a loaded CI runner) does not fail on time alone.
``SHARDVI_TEST_TIMEOUT_SCALE`` multiplies every limit further.
"""

import os


def scaled(seconds: float) -> float:
    """``seconds`` times ``max(1, load per core)`` times ``$SHARDVI_TEST_TIMEOUT_SCALE`` (default 1)."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        load = 1.0
    return seconds * max(1.0, load) * float(os.environ.get("SHARDVI_TEST_TIMEOUT_SCALE", "1"))
