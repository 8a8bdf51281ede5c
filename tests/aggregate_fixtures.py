"""The counter of the tests that commit from child processes (which import it by module path).

The domain is the example counter (benchmarks/domains/counter.py); this module only declares the tests'
state of it, `TestHotCounter`, so that a child process declares the same state by importing this path.
"""

from __future__ import annotations

from benchmarks.domains import counter as counter_domain

_counter = counter_domain.declare("TestHotCounter")
counter, increment, slow_increment = _counter.state, _counter.increment, _counter.slow_increment
