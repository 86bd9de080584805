"""The randomness policy: which random numbers are public, which are secret, and where each comes from.

Public randomness is what every party must agree on: the order of the mini-batches and, in a
simulation, the split and its missingness mask. It follows from the job's public `seed` through
numpy's `SeedSequence` (`public_rng`), and knowing it reveals nothing secret.

Secret randomness is everything else: a party's initial weights, its sampling noise (FALSE-VFL-II's
imputations), the active party's latent samples, and mask keys. Each party draws it from its own
`RoleSecret` (32 bytes of operating-system entropy), expanded by AES-256-CTR from `cryptography`
into named streams (`KeyStream`). A secret never leaves its party: it is kept beside that party's own
checkpoints, so a resumed run continues the same streams. Repeatable predictions key the active party's
noise per record instead (`RoleSecret.record_stream`, `RecordNoise`: the role secret and a keyed hash of
the record's ID, so a row's noise does not depend on its batch), and a party's prediction-time imputation
noise is one secret draw shared by every row (`SharedNoise`). Mask keys are not derived from it at all
(they come from a fresh X25519 agreement, `secure.masks`). Nothing secret is ever derived from the
public seed; only tests and the deliberately weakened builds of the attack tests inject secrets
(`RoleSecret.for_tests`).

Never use `torch.Generator`, `random` or `numpy.random` for anything secret.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from enum import IntEnum, unique

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

SECRET_BYTES = 32
RECORD_KEY_DOMAIN = b"falsevfl-recid"  # BLAKE2b personalisation: record keys from record IDs
RECORD_STREAM_DOMAIN = b"falsevfl-recnse"  # ... and per-record noise streams (apart from `stream`'s keys)
_BLOCK = 16  # AES block: the CTR counter counts these
_ZEROS = memoryview(bytes(1 << 18))  # read-only zeros: AES-CTR turns them into the keystream, 256 KiB per call

@unique
class PublicStream(IntEnum):
    """Every purpose of public random numbers, each with a stream of its own: `public_rng(seed, purpose,
    *more)` draws from SeedSequence([seed, purpose, *more]) with a fixed number of further words per
    purpose (`PUBLIC_WORDS`), so no two purposes (and no two uses of one purpose) share a stream. The
    values of the split streams and of the federation's are those the project has always used, so splits,
    held-out records and demo tables stay reproducible across versions."""

    SPLIT_LABELED = 1  # which training rows are labeled (the first n_aligned of them: the aligned reserve)
    SPLIT_TRAIN_MASK = 2  # + crc32(mechanism): the training split's missing blocks
    SPLIT_TEST_MASK = 3  # + crc32(mechanism): each test pattern's missing blocks
    SUBSAMPLE = 4  # --max-rows: which rows a smoke test keeps
    SPLIT_CELLS = 5  # + (0 train | 1 test): the cells removed inside held blocks (simulations)
    BATCH_ORDER = 6  # + (stage, epoch): the mini-batches of an epoch
    SUBSETS = 7  # + (epoch, batch): LASER-VFL's sampled subsets of the observed parties
    PERMUTED_LABELS = 12345  # the label-privacy test's permuted labels (runtime.session)
    DEMO_TABLES = 1117063369  # crc32(b"federation demo"): the demo's record IDs and tables
    TABLES_DEMO = 2492801163  # crc32(b"federation tables demo"): the real-tables demo's columns
    VALIDATION = 1125857209  # crc32(b"federation validation"): the federation's held-out records
    LIFT_BOOTSTRAP = 2408976098  # crc32(b"lift bootstrap"): the lift's resampled validation records


PUBLIC_WORDS: dict[PublicStream, int] = {
    PublicStream.SPLIT_LABELED: 0, PublicStream.SPLIT_TRAIN_MASK: 1, PublicStream.SPLIT_TEST_MASK: 1,
    PublicStream.SUBSAMPLE: 0, PublicStream.SPLIT_CELLS: 1, PublicStream.BATCH_ORDER: 2, PublicStream.SUBSETS: 2,
    PublicStream.PERMUTED_LABELS: 0, PublicStream.DEMO_TABLES: 0, PublicStream.TABLES_DEMO: 0,
    PublicStream.VALIDATION: 0, PublicStream.LIFT_BOOTSTRAP: 0}


PublicGenerator = np.random.Generator  # what `public_rng` returns: public numbers only, never a secret


def public_rng(seed: int, purpose: PublicStream, *more: int) -> PublicGenerator:
    """A public generator (batch order, simulated splits, ...): every party derives the same numbers. Each
    `purpose` is its own stream, with exactly `PUBLIC_WORDS[purpose]` further words."""
    if not isinstance(purpose, PublicStream) or len(more) != PUBLIC_WORDS[purpose]:
        raise ValueError(f"public_rng: {purpose!r} takes {PUBLIC_WORDS.get(purpose, '?')} further words, got "
                         f"{len(more)} (every public purpose is a PublicStream)")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(purpose), *(int(s) for s in more)]))


class KeyStream:
    """An AES-256-CTR keystream read from a position: the one source of secret random numbers.

    The state is just the byte position, so a checkpoint stores an int and a resumed stream continues
    with exactly the bytes an uninterrupted one would have produced. Counter blocks are never reused.
    """

    def __init__(self, key: bytes, position: int = 0) -> None:
        if len(key) != SECRET_BYTES:
            raise ValueError(f"a stream key has {SECRET_BYTES} bytes, got {len(key)}")
        self._key, self.position = bytes(key), int(position)

    def _encryptor(self):
        """An AES-256-CTR encryptor whose next output byte is the stream's byte at `position`."""
        block, offset = divmod(self.position, _BLOCK)
        encryptor = Cipher(algorithms.AES(self._key), modes.CTR(block.to_bytes(_BLOCK, "big"))).encryptor()
        if offset:
            encryptor.update(bytes(offset))  # the counter block's first `offset` bytes were read before
        return encryptor

    def read(self, n: int) -> bytes:
        """The next `n` bytes of the stream."""
        out = self._encryptor().update(bytes(n))
        self.position += n
        return out

    def read_into(self, out) -> None:
        """Write the next ``nbytes`` bytes of the stream into `out`, a writable C-contiguous buffer (a numpy
        array, a bytearray): the bytes `read` would return, encrypted straight into `out` with no
        intermediate copy (AES-CTR of a shared zero source; `cryptography` releases the GIL meanwhile)."""
        view = memoryview(out)
        if view.readonly or not view.c_contiguous:
            raise ValueError("KeyStream.read_into needs a writable, C-contiguous buffer")
        view = view.cast("B")
        encryptor, step = self._encryptor(), len(_ZEROS)
        for start in range(0, view.nbytes, step):
            size = min(step, view.nbytes - start)
            encryptor.update_into(_ZEROS[:size], view[start:start + size])
        self.position += view.nbytes

    def integers(self, n: int) -> np.ndarray:
        """`n` uniform int64 values (every bit pattern equally likely: uniform on the ring Z_2^64)."""
        out = np.empty(n, dtype=np.int64)
        self.read_into(out)
        return out

    def words(self, n: int) -> np.ndarray:
        """`n` uniform 64-bit words (uint64): the bits of `integers`."""
        return self.integers(n).view(np.uint64)

    def uniform(self, n: int) -> torch.Tensor:
        """`n` float64 values uniform on the open interval (0, 1) (32 random bits each)."""
        bits = torch.from_numpy(np.frombuffer(self.read(4 * n), dtype=np.uint32).astype(np.float64))
        return (bits + 0.5) / 2.0**32

    def normal(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> torch.Tensor:
        """Standard normal values of the given shape, dtype and device: Box-Muller in float32 on 24-bit
        uniforms from (0, 1) (so |values| < 5.9; the sampling noise of the model is this hot path)."""
        n = math.prod(shape)
        half = (n + 1) // 2
        bits = np.frombuffer(self.read(8 * half), dtype=np.uint32)
        uniform = torch.from_numpy((bits >> 8).astype(np.float32)).add_(0.5).mul_(2.0**-24)
        radius = uniform[:half].log_().mul_(-2.0).sqrt_()
        angle = uniform[half:].mul_(2.0 * math.pi)
        values = torch.empty(2 * half)
        torch.mul(radius, torch.cos(angle), out=values[:half])
        torch.mul(radius, angle.sin_(), out=values[half:])
        return values[:n].reshape(shape).to(device=device, dtype=dtype)

    def row_keys(self, n: int) -> np.ndarray:
        """(n, 32) uint8 keys read from the stream: one fresh key per batch row."""
        return np.frombuffer(self.read(SECRET_BYTES * n), dtype=np.uint8).reshape(n, SECRET_BYTES)

    def symmetric(self, shape: tuple[int, ...], bound: float) -> torch.Tensor:
        """float32 values uniform on (-bound, bound): PyTorch's default initialisation of a linear layer."""
        return ((2.0 * self.uniform(math.prod(shape)) - 1.0) * bound).reshape(shape).to(torch.float32)


@dataclass(frozen=True)
class RoleSecret:
    """One party's secret: 32 bytes from which all of its secret streams are derived by purpose."""

    key: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, bytes) or len(self.key) != SECRET_BYTES:
            raise ValueError(f"a role secret is {SECRET_BYTES} bytes")

    @classmethod
    def fresh(cls) -> RoleSecret:
        """A new secret from the operating system's entropy (what every real run uses)."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def for_tests(cls, seed: int, party: int) -> RoleSecret:
        """A reproducible secret, for tests that compare runtimes and for the weakened builds of the
        attack tests (with the public seed it is exactly the old, broken derivation). Never used by a run."""
        return cls(hashlib.blake2b(f"{seed}:{party}".encode(), digest_size=SECRET_BYTES,
                                   person=b"falsevfl-tests").digest())

    def stream(self, purpose: str, position: int = 0) -> KeyStream:
        """The stream for `purpose` (keyed BLAKE2b as the key-derivation PRF), at `position`."""
        key = hashlib.blake2b(purpose.encode(), key=self.key, digest_size=SECRET_BYTES).digest()
        return KeyStream(key, position)

    def record_key(self, record_id: str) -> bytes:
        """The 32-byte key of one record: keyed BLAKE2b of its ID under this secret (never the ID
        itself), in its own domain (`person`), so it is no stream key and no other party's key."""
        return hashlib.blake2b(record_id.encode(), key=self.key, digest_size=SECRET_BYTES,
                               person=RECORD_KEY_DOMAIN).digest()

    def record_stream(self, purpose: str, record_key: bytes) -> KeyStream:
        """The stream of one record for `purpose`: keyed by BLAKE2b(key = this secret,
        "predict/<purpose>/" + record key), in a domain of its own, so that the same record gets the
        same numbers in every run of the same model, whatever batch it is in, and nobody without this
        secret can compute them."""
        if len(record_key) != SECRET_BYTES:
            raise ValueError(f"a record key has {SECRET_BYTES} bytes, got {len(record_key)}")
        data = f"predict/{purpose}/".encode() + bytes(record_key)
        key = hashlib.blake2b(data, key=self.key, digest_size=SECRET_BYTES, person=RECORD_STREAM_DOMAIN).digest()
        return KeyStream(key)

    def to_tensor(self) -> torch.Tensor:
        """uint8 tensor form, for the party's own checkpoint (loadable with weights_only=True)."""
        return torch.frombuffer(bytearray(self.key), dtype=torch.uint8).clone()

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> RoleSecret:
        return cls(bytes(tensor.to(torch.uint8).tolist()))


class RoleRandomness:
    """One party's named secret streams, created on first use; `state` and `restore` for checkpoints."""

    def __init__(self, secret: RoleSecret) -> None:
        self.secret = secret
        self._streams: dict[str, KeyStream] = {}

    def stream(self, purpose: str) -> KeyStream:
        if purpose not in self._streams:
            self._streams[purpose] = self.secret.stream(purpose)
        return self._streams[purpose]

    def restart(self, purpose: str) -> KeyStream:
        """The stream for `purpose` from its beginning (evaluation: the same draws however long training ran)."""
        self._streams[purpose] = self.secret.stream(purpose)
        return self._streams[purpose]

    def state(self) -> dict[str, int]:
        return {purpose: stream.position for purpose, stream in self._streams.items()}

    def restore(self, state: dict[str, int]) -> None:
        self._streams = {purpose: self.secret.stream(purpose, int(position)) for purpose, position in state.items()}

    def load(self, secret: RoleSecret, state: dict[str, int]) -> None:
        """Become a saved party's randomness: its secret and its streams' positions (a resumed run)."""
        self.secret = secret
        self.restore(state)


def record_keys(secret: RoleSecret, record_ids: list[str | None]) -> np.ndarray:
    """(N, 32) uint8: `secret.record_key` of every ID, the `record_keys` of a party's hosted data; a
    zero row for None (a record this party does not list)."""
    out = np.zeros((len(record_ids), SECRET_BYTES), dtype=np.uint8)
    for row, record_id in enumerate(record_ids):
        if record_id is not None:
            out[row] = np.frombuffer(secret.record_key(record_id), dtype=np.uint8)
    return out


def _key_rows(keys: np.ndarray, what: str) -> np.ndarray:
    keys = np.asarray(keys, dtype=np.uint8)
    if keys.ndim != 2 or keys.shape[1] != SECRET_BYTES:
        raise ValueError(f"{what} are an (N, {SECRET_BYTES}) uint8 array, got shape {keys.shape}")
    return keys


class RowNoise:
    """Noise per batch row: row b of every draw comes from row b's own stream, read on from where the
    last draw stopped, so a row's numbers never depend on the rows beside it in the batch or their
    order. Draws are laid out like `KeyStream.normal`'s in the model: (S, B, *rest). `from_keys` keys
    the streams directly (the row keys a broadcast of moments sends: every holder draws alike)."""

    def __init__(self, streams: list[KeyStream]) -> None:
        self._streams = streams

    @classmethod
    def from_keys(cls, keys: np.ndarray) -> RowNoise:
        return cls([KeyStream(row.tobytes()) for row in _key_rows(keys, "row keys")])

    def row_keys(self, n: int) -> np.ndarray:
        """(n, 32) uint8: the next 32 bytes of each row's stream (n must be the number of rows)."""
        if n != len(self._streams):
            raise ValueError(f"keys for {n} rows from the streams of {len(self._streams)} rows")
        keys = b"".join(s.read(SECRET_BYTES) for s in self._streams)
        return np.frombuffer(keys, dtype=np.uint8).reshape(n, SECRET_BYTES)

    def normal(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> torch.Tensor:
        """Standard normal values of `shape` = (S, B, *rest); column b from row b's stream."""
        if len(shape) < 2 or shape[1] != len(self._streams):
            raise ValueError(f"a draw for {len(self._streams)} records has shape (S, {len(self._streams)}, ...), "
                             f"got {tuple(shape)}")
        if not self._streams:
            return torch.zeros(shape, dtype=dtype, device=device)
        per_row = (shape[0], *shape[2:])
        return torch.stack([s.normal(per_row) for s in self._streams], dim=1).to(device=device, dtype=dtype)


class RecordNoise(RowNoise):
    """Secret noise per record: row b's stream is `RoleSecret.record_stream(purpose, keys[b])`, so a row's
    numbers depend on the secret and its record key only."""

    def __init__(self, secret: RoleSecret, purpose: str, keys: np.ndarray) -> None:
        super().__init__([secret.record_stream(purpose, row.tobytes()) for row in _key_rows(keys, "record keys")])


class SharedNoise:
    """Secret noise that is the same for every row of a draw: one (S, 1, *rest) draw from `stream`,
    repeated along the batch axis. For prediction-time imputations at a party, which need i.i.d. draws
    across a row's S importance samples, not across rows: each row's estimate has the distribution
    it has with independent rows, and it does not depend on the batch."""

    def __init__(self, stream: KeyStream) -> None:
        self._stream = stream

    def normal(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> torch.Tensor:
        if len(shape) < 2:
            raise ValueError(f"a shared draw has shape (S, B, ...), got {tuple(shape)}")
        one = self._stream.normal((shape[0], 1, *shape[2:]), dtype, device)
        return one.expand(tuple(shape))
