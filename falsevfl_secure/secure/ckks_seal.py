"""SEAL's CKKS operations on the keys of a TenSEAL context, and SEAL's serialisation of one ciphertext.

`secure.ckks` builds its messages from these; the pooled encryptions of zero of `secure.zero_maker` are made
with them in a helper process, so this module needs neither torch nor anything else of the package.

Every ciphertext here is a SEAL ``Ciphertext`` at the context's first data level and scale, whose N / 2
complex slots carry N real values: values 2i and 2i + 1 are the real and imaginary parts of slot i (see
`secure.ckks`, "Packing" and "Offline/online encryption").
"""

from __future__ import annotations

import os
import tempfile
import threading
import weakref

import numpy as np
import tenseal as ts
from tenseal import sealapi

__all__ = ["SealTools", "load_ciphertext", "save_ciphertext", "seal_tools"]


class SealTools:
    """SEAL's objects for one TenSEAL context, made once: encoder, evaluator, and the encryptor (public key)
    and decryptor (secret key) that the context holds."""

    def __init__(self, ctx: ts.Context) -> None:
        self.context = ctx.seal_context().data
        self.first = self.context.first_parms_id()
        self.scale = ctx.global_scale
        self.encoder = sealapi.CKKSEncoder(self.context)
        self.evaluator = sealapi.Evaluator(self.context)
        self.encryptor = sealapi.Encryptor(self.context, ctx.public_key().data) if ctx.has_public_key() else None
        self.decryptor = sealapi.Decryptor(self.context, ctx.secret_key().data) if ctx.has_secret_key() else None

    def encode(self, values: np.ndarray) -> sealapi.Plaintext:
        """N float64 values as the N / 2 complex slots (even: real parts, odd: imaginary parts)."""
        plain = sealapi.Plaintext()
        self.encoder.encode(values.view(np.complex128).tolist(), self.first, self.scale, plain)
        return plain

    def zero(self) -> sealapi.Ciphertext:
        """A fresh public-key encryption of zero (SEAL's randomness) at the first data level and the values'
        scale: what `Encryptor::encrypt` makes before it adds the plaintext into c_0."""
        ciphertext = sealapi.Ciphertext(self.context)
        self.encryptor.encrypt_zero(self.first, ciphertext)
        ciphertext.scale = self.scale  # Encryptor::encrypt sets the plaintext's scale the same way
        return ciphertext

    def encrypt(self, values: np.ndarray) -> sealapi.Ciphertext:
        ciphertext = sealapi.Ciphertext(self.context)
        self.encryptor.encrypt(self.encode(values), ciphertext)
        return ciphertext

    def add_values(self, ciphertext: sealapi.Ciphertext, values: np.ndarray) -> None:
        """Add encoded values into a ciphertext in place (SEAL adds the plaintext into c_0)."""
        self.evaluator.add_plain_inplace(ciphertext, self.encode(values))

    def decrypt(self, ciphertext: sealapi.Ciphertext) -> np.ndarray:
        """The N float64 values of a ciphertext (its slots' real and imaginary parts, interleaved)."""
        plain = sealapi.Plaintext()
        self.decryptor.decrypt(ciphertext, plain)
        return np.asarray(self.encoder.decode_complex(plain), dtype=np.complex128).view(np.float64)


_TOOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def seal_tools(ctx: ts.Context) -> SealTools:
    """The `SealTools` of a context (made on first use, dropped with the context)."""
    if ctx not in _TOOLS:
        _TOOLS[ctx] = SealTools(ctx)
    return _TOOLS[ctx]


# SEAL's binding saves and loads ciphertexts through a file path only: each thread keeps one anonymous
# in-memory file (memfd; an unnamed temporary file where there is none), which holds nothing but the
# ciphertext being saved or loaded.
_SCRATCH = threading.local()


def _scratch() -> tuple[int, str]:
    if not hasattr(_SCRATCH, "path"):
        if hasattr(os, "memfd_create"):
            _SCRATCH.file = os.fdopen(os.memfd_create("falsevfl-ckks"), "r+b")
        else:
            _SCRATCH.file = tempfile.TemporaryFile()
        fd = _SCRATCH.file.fileno()
        _SCRATCH.path = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fd}"
    return _SCRATCH.file.fileno(), _SCRATCH.path


def save_ciphertext(ciphertext: sealapi.Ciphertext) -> bytes:
    """SEAL's serialisation of a ciphertext (compressed as SEAL does by default)."""
    fd, path = _scratch()
    ciphertext.save(path)  # opens the path anew, truncating it
    return os.pread(fd, os.fstat(fd).st_size, 0)


def load_ciphertext(tools: SealTools, data: bytes | memoryview) -> sealapi.Ciphertext:
    """Parse a serialised ciphertext under `tools`' context; SEAL refuses data that is not valid for its
    parameters (ValueError/RuntimeError)."""
    fd, path = _scratch()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    ciphertext = sealapi.Ciphertext(tools.context)
    ciphertext.load(tools.context, path)
    return ciphertext
