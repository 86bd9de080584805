"""This process's C heap (glibc's malloc): keep freed blocks for the next step's tensors, and hand them back to
the kernel after a phase whose memory the next one does not reuse. Elsewhere than glibc, nothing. The settings
are the whole process's and stay: a program that builds a run in its own process (a notebook) inherits them."""

from __future__ import annotations

import ctypes
import functools
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None  # musl, macOS, Windows: their allocators have no mallopt
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


@functools.cache
def keep_freed_memory() -> None:
    """glibc's malloc keeps freed blocks of up to 32 MB for the next tensor instead of giving them back to the
    kernel: by default it unmaps a freed block above its dynamic threshold and trims the heap's top above 128 KB,
    so every step's activations (5 MB each on a table at batch 1,024) came back as fresh pages, one page fault per
    4 KB (bench/overhead.py --shape tables, one process, one thread: 55 -> 49 ms a stage-1 step; peak RSS the
    same). Both are set: a trim threshold alone fixes the mmap threshold at 128 KB (137 ms). Once per process."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


def give_back_freed_memory() -> None:
    """Return every arena's free memory to the kernel (after the alignment: its buffers, some freed in the
    network's threads' own arenas, which training in the main thread would not reuse)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (a trial could not measure a party's: the parties run as
    the launcher's grandchildren, so `/usr/bin/time` saw the launcher alone)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: kibibytes
