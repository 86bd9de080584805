"""Communication accounting: which rounds ran, and per party and round the messages, bytes and time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class CommLog:
    """Per (round, party) counters plus the ordered trace of executed rounds.

    `trace` holds one entry per executed round (forward or adjoint), in execution order, so a test
    can compare it with the protocol spec. Counters are per party: bytes a party sent and received.
    """

    trace: list[str] = field(default_factory=list)
    _counters: dict[tuple[str, int], list[float]] = field(
        default_factory=lambda: defaultdict(lambda: [0, 0, 0, 0.0])
    )
    enabled_trace: bool = True

    def round(self, name: str) -> None:
        if self.enabled_trace:
            self.trace.append(name)

    def add(self, name: str, party: int, sent: int = 0, received: int = 0, seconds: float = 0.0,
            messages: int = 1) -> None:
        counter = self._counters[(name, party)]
        counter[0] += messages
        counter[1] += sent
        counter[2] += received
        counter[3] += seconds

    def table(self) -> list[dict]:
        """Rows `{"round", "party", "messages", "bytes_sent", "bytes_received", "seconds"}`."""
        return [
            {"round": name, "party": party, "messages": int(c[0]), "bytes_sent": int(c[1]),
             "bytes_received": int(c[2]), "seconds": round(c[3], 6)}
            for (name, party), c in sorted(self._counters.items(), key=lambda kv: (kv[0][0], kv[0][1]))
        ]

    def reset_trace(self) -> None:
        self.trace.clear()
