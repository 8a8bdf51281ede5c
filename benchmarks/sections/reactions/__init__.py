"""Sections of `manage.py bench_reactions`: reaction latency, claim contention, watermark-aware
claims, batch vs per-event projection replay, lane responsiveness (see docs/bench-reactions.md).

One module per section (`run(ctx)`, its own options); `support` holds what they share.
"""
