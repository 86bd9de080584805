"""Test-only: reveal shares with CrypTen's own code. The shares come from real party processes over our links;
CrypTen's `InProcessCommunicator` then runs one thread per party, each holding that party's share, and its
`ArithmeticSharedTensor.reveal` / `get_plain_text` sum and decode them exactly as CrypTen's parties would.
CrypTen's pseudo-random generators are never used: nothing of ours draws from them."""

from __future__ import annotations

import threading

import torch

from falsevfl_secure.secure.crypten_shim import import_crypten


def reveal_with_crypten(shares: list[torch.Tensor], precision: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(the revealed ring elements, CrypTen's decoding of them) of one value shared as `shares` (one per party)."""
    crypten = import_crypten()
    out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    errors: list[BaseException] = []
    # CrypTen's threads share one mailbox per rank and its recv refuses a message from another sender: a thread
    # still swapping PRNG seeds in init_thread could take a faster thread's reveal message and fail, leaving
    # the others at CrypTen's barrier forever. So every thread finishes init_thread before any reveals.
    set_up = threading.Barrier(len(shares))
    _order_crypten_seed_broadcast()

    def party(rank: int) -> None:
        try:
            crypten.init_thread(rank, len(shares))
            set_up.wait(timeout=60)
            tensor = crypten.mpc.primitives.ArithmeticSharedTensor.from_shares(shares[rank], precision=precision)
            out[rank] = (tensor.reveal(), tensor.get_plain_text())
        except BaseException as error:  # reported by the caller's thread; the others stop waiting
            errors.append(error)
            set_up.abort()
            _abort_crypten_barrier()

    threads = [threading.Thread(target=party, args=(rank,), daemon=True) for rank in range(len(shares))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        _reset_crypten_mailboxes()  # a broken barrier would fail the next reveal in this process at once
        raise errors[0]
    assert not any(thread.is_alive() for thread in threads), "CrypTen's reveal did not finish within 120 s"
    assert all(torch.equal(out[r][0], out[0][0]) for r in out)  # every party reveals the same integers
    return out[0]


def _abort_crypten_barrier() -> None:
    from crypten.communicator.in_process_communicator import InProcessCommunicator

    if InProcessCommunicator.barrier is not None:
        InProcessCommunicator.barrier.abort()


def _order_crypten_seed_broadcast() -> None:
    """CrypTen's `init_thread` races with three or more threads: rank 0 broadcasts the global seed into every
    mailbox as soon as it has its own neighbour's seed, so rank 2 can find the broadcast (a bare tensor)
    before rank 1's (rank, seed) pair and fail unpacking it. A barrier at the broadcast's entry lets every
    thread's seed exchange finish first (each thread's exchange precedes its broadcast call)."""
    from crypten.communicator.in_process_communicator import InProcessCommunicator

    original = InProcessCommunicator.broadcast
    if getattr(original, "ordered", False):
        return

    def broadcast(self, tensor, src, async_op=False):
        self.barrier.wait(timeout=60)
        return original(self, tensor, src, async_op)

    broadcast.ordered = True
    InProcessCommunicator.broadcast = broadcast


def _reset_crypten_mailboxes() -> None:
    """CrypTen keeps its in-process mailboxes and barrier on the class: the next `init_thread` makes new ones."""
    from crypten.communicator.in_process_communicator import InProcessCommunicator

    InProcessCommunicator.mailbox = InProcessCommunicator.barrier = None
