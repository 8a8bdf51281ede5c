"""The old path of Loom's Django Tasks backend (deprecated): it is `queues.tasks.LoomBackend` now.

A TASKS setting that names `journal.tasks.LoomBackend` keeps working (the same class), with a
DeprecationWarning when Django imports it; name the new path (docs/queues.md, "Django tasks"). The backend
always needed the queues app; living there, it keeps the journal from importing an app above it. This shim
is the journal's one allowed upward import (tests/test_layout.py, UPWARD_ALLOWED), until it goes.
"""

import warnings

from queues.tasks import *  # noqa: F403  (every public name of the old module)
from queues.tasks import LoomBackend  # noqa: F401

warnings.warn("journal.tasks is deprecated: name queues.tasks.LoomBackend in TASKS (docs/queues.md)",
              DeprecationWarning, stacklevel=2)
