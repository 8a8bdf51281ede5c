"""Wake-up on PostgreSQL: LISTEN on the journal's channel, turn payloads into bumps and wake-ups.

The listener has its own psycopg connection (autocommit, outside Django's pool), because a
LISTEN must stay on one session; the bumps it makes go through Django's connection of its thread.
A notification whose types no consumer follows wakes nothing and costs no query (drain skip).
Notifications can be lost (a reconnect, {"poll": true} for a large statement): the correlator's
scan and the lanes' polling cover that, and a reconnect triggers a scan at once.

A notification is a hint, never a fact: any role that can connect may NOTIFY the channel. A payload
that is not a well-formed journal notification asks for a scan (which believes only committed
events); the tips of a good one are clamped to the streams' real last seqs when they are stored
(store.bump(hinted=True)); and nothing in a payload can make this thread drop its connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from journal import conf
from journal.listen import connect
from projections.correlate import bumps_from_tips, parse_notification
from projections.declarations import Registry
from projections.store import store_for

log = logging.getLogger("loom.projections")


def _is_poll(payload: str) -> bool:
    return payload.replace(" ", "") == '{"poll":true}'


class Listener:
    """Runs in its own thread until `stop` is set."""

    def __init__(self, registry: Registry, alias: str, wake_lanes: Callable[[set[str]], None],
                 wake_correlator: Callable[[], None], stop: threading.Event):
        self.registry, self.alias = registry, alias
        self.wake_lanes, self.wake_correlator, self.stop = wake_lanes, wake_correlator, stop
        self.received = 0
        self.bumped = 0
        self.rejected = 0  # payloads that were not journal notifications (answered with a scan)
        self.sessions = 0  # connections made: more than one means the LISTEN session was lost
        self.ready = threading.Event()

    def run(self) -> None:
        from psycopg import sql

        # Quoted as an identifier: the channel name is never pasted into the statement.
        listen = sql.SQL("LISTEN {}").format(sql.Identifier(conf.get("LOOM_NOTIFY_CHANNEL")))
        backoff = 0.1
        try:
            while not self.stop.is_set():
                try:
                    conn = connect(self.alias)
                except Exception as exc:  # database away: poll until it is back
                    log.warning("projections listener: cannot connect (%s); retrying", exc)
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                backoff = 0.1
                self.sessions += 1
                try:
                    with conn:
                        conn.execute(listen)
                        self.ready.set()
                        self.wake_correlator()  # anything committed while we were not listening
                        while not self.stop.is_set():
                            payloads = [n.payload for n in conn.notifies(timeout=0.25, stop_after=1)]
                            if not payloads:
                                continue
                            # Take everything queued so far in one go: one bump for a burst.
                            payloads += [n.payload for n in conn.notifies(timeout=0.0)]
                            self.handle(payloads)
                except Exception as exc:
                    if not self.stop.is_set():
                        log.warning("projections listener: connection lost (%s); reconnecting", exc)
                        self.stop.wait(backoff)
        finally:
            connections.close_all()

    def handle(self, payloads: list[str]) -> None:
        """Bump what the payloads say exactly, wake the lanes concerned; ask for a scan otherwise."""
        self.received += len(payloads)
        bumps, scan = [], False
        for payload in payloads:
            parsed = parse_notification(payload)
            if parsed is None:
                scan = True
                if not _is_poll(payload):
                    self.rejected += 1
                    log.debug("projections listener: not a journal notification: %.200r", payload)
                continue
            found, needs_scan = bumps_from_tips(self.registry, *parsed)
            bumps.extend(found)
            scan = scan or needs_scan
        if bumps:
            best: dict[tuple[str, str], tuple] = {}
            for b in bumps:
                key = (b[0], b[1])
                if key not in best or best[key][5] < b[5]:
                    best[key] = b
            try:
                self.bumped += store_for(self.alias).bump(list(best.values()), hinted=True)
            except Exception as exc:
                log.warning("projections listener: bump failed (%s); asking for a scan", exc)
                connections[self.alias].close()
                scan = True
            self.wake_lanes({b[3] for b in best.values()})
        if scan:
            self.wake_correlator()
