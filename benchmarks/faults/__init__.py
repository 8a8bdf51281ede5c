"""The fault suite (`manage.py loom_faults`, docs/reliability.md): scenarios that run real processes,
kill, stop and restart them at random points, and then check in SQL that nothing was lost, applied
twice or left stuck. One module per scenario; base.py (a round), processes.py (children),
children.py (what they run), fixtures.py and declarations.py (their flows and projections),
checks.py (the invariants)."""

SCENARIOS = {
    "commit-storm": "benchmarks.faults.commit_storm",
    "same-stream": "benchmarks.faults.same_stream",
    "drain-under-churn": "benchmarks.faults.drain_under_churn",
    "killed-worker": "benchmarks.faults.killed_worker",
    "zombie-owner": "benchmarks.faults.zombie_owner",
    "kill-mid-step": "benchmarks.faults.kill_mid_step",
    "kill-mid-batch": "benchmarks.faults.kill_mid_batch",
    "kill-mid-ack": "benchmarks.faults.kill_mid_ack",
    "pg-restart": "benchmarks.faults.pg_restart",
    "kill-after-send": "benchmarks.faults.kill_after_send",
    "exit-on-cap-one": "benchmarks.faults.exit_on_cap_one",
    "connection-spike": "benchmarks.faults.connection_spike",
    "failover": "benchmarks.faults.failover",
}
