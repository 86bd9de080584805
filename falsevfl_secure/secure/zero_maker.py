"""Encryptions of zero made ahead of need by a helper process that runs on otherwise idle CPU.

`ZeroMaker` starts the helper (``python -m falsevfl_secure.secure.zero_maker``: a new interpreter, so no
state of the party's process is copied into it, and SEAL draws every encryption's randomness afresh from
the operating system), hands it the public context on its stdin, and reads fresh encryptions of zero
from its stdout, one frame each (uint32 length, then SEAL's serialised ciphertext). A reader thread parses
them into a queue of at most `capacity`; past that it stops reading, the pipe fills, and the helper blocks.
With `idle` the helper puts itself in the SCHED_IDLE scheduling class (else at nice 19), so it takes CPU only
when no other process on the host wants it: the party's own work, its peers' and the aggregator's keep
their speed, and when the host is busy the queue simply runs dry (`pop` returns None).

Trust: the helper belongs to the party that starts it (same host and user, anonymous pipes only, never a
socket). Its zeros are as secret as the party's inputs (knowing a ciphertext's zero reveals its values)
and never leave the party; `pop` hands each out once. The helper ends when the maker closes (it is
killed: it holds nothing worth keeping) or when the party's process ends (its next write fails).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from .ckks_seal import SealTools, load_ciphertext, save_ciphertext

__all__ = ["ZeroMaker"]

_FRAME = struct.Struct(">I")
_PIPE_BYTES = 1 << 20  # room for ~5 ciphertexts in the pipe (F_SETPIPE_SZ; the default is 64 KiB)


class ZeroMaker:
    """A helper process making fresh encryptions of zero under the context of `tools` (whose public part
    is `public_context`), and the queue they arrive in (see the module docstring)."""

    def __init__(self, public_context: bytes, tools: SealTools, idle: bool = True) -> None:
        self.tools, self.capacity = tools, 0
        self._ready: deque = deque()  # at most `capacity`: the reader waits for room before it adds (_wait_for_room)
        self._cond = threading.Condition()
        self._open = True
        self._process = subprocess.Popen([sys.executable, "-m", __name__, "idle" if idle else "normal"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_same_package())
        _widen(self._process.stdout.fileno())
        self._process.stdin.write(_FRAME.pack(len(public_context)) + public_context)
        self._process.stdin.close()
        self._reader = threading.Thread(target=self._read, name="zero-maker", daemon=True)
        self._reader.start()

    def want(self, capacity: int) -> None:
        """Keep up to `capacity` zeros ready."""
        with self._cond:
            self.capacity = capacity
            self._cond.notify_all()

    def pop(self):
        """A zero made by the helper, handed out once; None while none is ready."""
        with self._cond:
            if not self._ready:
                return None
            self._cond.notify_all()
            return self._ready.popleft()

    def __len__(self) -> int:
        return len(self._ready)

    def _read(self) -> None:
        try:
            while self._wait_for_room():
                head = self._process.stdout.read(_FRAME.size)
                data = self._process.stdout.read(_FRAME.unpack(head)[0]) if len(head) == _FRAME.size else b""
                if not data:
                    return  # the helper ended
                zero = load_ciphertext(self.tools, data)
                if zero.size() != 2 or zero.parms_id() != self.tools.first or zero.scale != self.tools.scale:
                    return  # not what SealTools.zero makes: use none of it
                with self._cond:
                    self._ready.append(zero)
        except (OSError, ValueError, RuntimeError):
            return  # a broken pipe or a bad frame: the queue stays dry and the party encrypts at once

    def _wait_for_room(self) -> bool:
        with self._cond:
            while self._open and len(self._ready) >= self.capacity:
                self._cond.wait()
            return self._open

    def close(self) -> None:
        """Stop the helper and drop every zero not handed out."""
        with self._cond:
            self._open = False
            self._ready.clear()
            self._cond.notify_all()
        self._process.kill()
        self._process.wait()
        self._reader.join(timeout=5)
        self._process.stdout.close()


def _same_package() -> dict[str, str]:
    """The environment for the helper, importing this very package first (not another installed copy)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def _widen(fd: int) -> None:
    """A pipe that holds several ciphertexts, where the system allows it (Linux F_SETPIPE_SZ)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    except (ImportError, OSError):
        pass


def _lower_priority(idle: bool) -> None:
    if idle and hasattr(os, "sched_setscheduler"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except OSError:
            pass
    os.nice(19 if idle else 0)


def main(mode: str) -> None:
    """The helper: read the public context, then write fresh encryptions of zero until the pipe breaks."""
    import signal

    import tenseal as ts

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the party's to handle; it closes the pipe
    _lower_priority(mode == "idle")
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    size = _FRAME.unpack(source.read(_FRAME.size))[0]
    tools = SealTools(ts.context_from(source.read(size), n_threads=1))
    try:
        while True:
            data = save_ciphertext(tools.zero())
            sink.write(_FRAME.pack(len(data)) + data)
            sink.flush()
    except OSError:  # the maker closed the pipe (or its process ended)
        os._exit(0)  # without flushing a broken pipe again at exit


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "idle")
