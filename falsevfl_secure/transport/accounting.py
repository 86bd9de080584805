"""Communication accounting: which rounds ran, and per round and party the messages, bytes, time, and the
largest magnitude a party contributed to a sum (how close a run comes to a secure protocol's range)."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from .rounds import VOCABULARY

SPANS = 256  # rounds kept for the timeline: a step's rounds, whatever the method (a long run keeps no more)


@dataclass
class CommLog:
    """Per (round, party) counters plus the ordered trace of executed rounds.

    `trace` holds one entry per executed round (forward or adjoint) in execution order, so a test can
    compare it with the protocol's table. `timed` says whether `seconds` were measured (a distributed
    transport times every round; the local one has nothing to time). `spans`: the last rounds' (name, start,
    end) on `time.perf_counter`'s clock (bounded: a step's timeline, `runtime.session.run_step`)."""

    timed: bool = False
    trace: list[str] = field(default_factory=list)
    spans: deque = field(default_factory=lambda: deque(maxlen=SPANS))
    _counters: dict[tuple[str, int], list[float]] = field(
        default_factory=lambda: defaultdict(lambda: [0, 0, 0, 0.0, 0.0, 0.0]))

    def round(self, name: str) -> None:
        self.trace.append(name)

    def ran(self, name: str, party: int, sent: int, received: int, seconds: float, waiting: float,
            peak: float = 0.0, started: float | None = None) -> None:
        """One executed round, traced and counted in one call (the distributed transport's path); `started`:
        when it began (perf_counter), for the step's timeline."""
        self.trace.append(name)
        if started is not None:
            self.spans.append((name, started, started + seconds))
        counter = self._counters[(name, party)]
        counter[0] += 1
        counter[1] += sent
        counter[2] += received
        counter[3] += seconds
        counter[4] = max(counter[4], peak)
        counter[5] += waiting

    def add(self, name: str, party: int, sent: int = 0, received: int = 0, seconds: float = 0.0,
            messages: int = 1, peak: float = 0.0, waiting: float = 0.0) -> None:
        counter = self._counters[(name, party)]
        for i, value in enumerate((messages, sent, received, seconds)):
            counter[i] += value
        counter[4] = max(counter[4], peak)
        counter[5] += waiting

    def table(self) -> list[dict]:
        """One row per (round, party): messages, bytes sent and received, seconds (of them `waiting`: blocked
        until a peer's message arrived; the rest is the protocol's own work: encoding, masks, encryption),
        and `peak`, the largest |value| the party contributed to the round's sums (0 for a broadcast)."""
        order = {r.name: i for i, r in enumerate(VOCABULARY)}
        rows = []
        for (name, party), c in sorted(self._counters.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
            rows.append({"round": name, "party": party, "messages": int(c[0]), "bytes_sent": int(c[1]),
                         "bytes_received": int(c[2]), "seconds": round(c[3], 6), "waiting": round(c[5], 6),
                         "peak": float(f"{c[4]:.6g}")})
        return rows

    def totals(self) -> tuple[float, float]:
        """(seconds in rounds, seconds of them waiting on the network), summed over every round and party."""
        return (sum(c[3] for c in self._counters.values()), sum(c[5] for c in self._counters.values()))


def per_round(rows: list[dict], timed: bool) -> list[dict]:
    """The table a reader needs: per round, the messages and bytes over all parties, and the time
    (the slowest party's) only where it was measured."""
    out: dict[str, dict] = {}
    for row in rows:
        entry = out.setdefault(row["round"], {"round": row["round"], "messages": 0, "bytes": 0, "seconds": 0.0,
                                              "peak": 0.0})
        entry["messages"] += row["messages"]
        entry["bytes"] += row["bytes_sent"]
        entry["seconds"] = max(entry["seconds"], row.get("seconds", 0.0))
        entry["peak"] = max(entry["peak"], row.get("peak", 0.0))
    if not timed:
        for entry in out.values():
            entry.pop("seconds")
    return list(out.values())


def merge_tables(tables: list[list[dict]]) -> list[dict]:
    """Several parties' own `CommLog.table()` rows as one table in round order, then party order (what the
    operator of every role, e.g. a simulation's launcher, may put together; no party sees another's)."""
    order = {r.name: i for i, r in enumerate(VOCABULARY)}
    rows = [row for table in tables for row in table]
    return sorted(rows, key=lambda r: (order.get(r["round"], len(order)), r["party"]))
