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

    def party(rank: int) -> None:
        try:
            crypten.init_thread(rank, len(shares))
            tensor = crypten.mpc.primitives.ArithmeticSharedTensor.from_shares(shares[rank], precision=precision)
            out[rank] = (tensor.reveal(), tensor.get_plain_text())
        except BaseException as error:  # reported by the caller's thread
            errors.append(error)

    threads = [threading.Thread(target=party, args=(rank,)) for rank in range(len(shares))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    assert all(torch.equal(out[r][0], out[0][0]) for r in out)  # every party reveals the same integers
    return out[0]
