"""Test-only: attach CrypTen's communicator to a gloo world we already joined, so that CrypTen's own code can
reveal our shares. CrypTen cannot reuse an existing process group through `crypten.init()` (it silently
does nothing), so the attributes its `DistributedCommunicator.__init__` would set are set here. CrypTen's
pseudo-random generators are never initialised: nothing of ours draws from them."""

from __future__ import annotations

import torch.distributed as dist

from falsevfl_secure.secure.crypten_shim import import_crypten


def attach_crypten():
    crypten = import_crypten()
    comm_cls = crypten.communicator.DistributedCommunicator
    communicator = comm_cls.__new__(comm_cls)
    communicator.distributed_backend, communicator.rendezvous = "gloo", "env://"
    communicator.world_size, communicator.rank = dist.get_world_size(), dist.get_rank()
    communicator.reset_communication_stats()
    communicator._name = f"rank{communicator.rank}"
    communicator.main_group = communicator.ttp_group = dist.new_group(list(range(communicator.world_size)))
    communicator.ttp_initialized = False
    comm_cls.instance = communicator
    return crypten
