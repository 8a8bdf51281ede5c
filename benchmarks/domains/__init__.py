"""The example aggregate domains: one home for the counter, ticket, inventory and calculator that both the
tests and the benches drive.

Why here: benches may not import tests (tests are not shipped with the apps, and a bench must run in a
host project that has none), and the journal must not carry example domains into every project that
installs it. The benchmarks app is where measuring code and its fixtures already live, and the tests
already import it; so the domains live in `benchmarks.domains`, one module per domain.

Each module holds the domain's pydantic models at module level and a `declare(name, **state_options)`
that builds a fresh `State` with its events, invariants and actions and returns them together: the
same domain can be declared under several names (tests use `Test...` states with their own stream
prefix; benches use `Bench...` states with the prefix `bench:`, so their streams are removed with the
run). State names are unique in a process, so every caller declares its own.
"""
