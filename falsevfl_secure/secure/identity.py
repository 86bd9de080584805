"""Long-term identities of a federation's participants: Ed25519 keys, the lines that pin them, signatures
over labelled messages, and the TLS credentials bound to them.

An identity is an Ed25519 key pair (`cryptography`). The private key stays in a file that only its owner
may read (`write_private_key`, `read_private_key`); every other participant pins the public key in its own
federation.toml as `key = "ed25519:<base64>"` (`pin_text`, `parse_pin`). What a participant announces
and others must believe (its agreement record, its ephemeral X25519 key, the active party's roster, kept
rows and CKKS public context) is signed with `sign(key, label, message)` and checked with `verify`
against the pin. Labels separate the purposes, so a signature made for one message never verifies as
another.

TLS. gRPC's TLS (BoringSSL) does not negotiate Ed25519 handshake signatures, so every run makes a fresh
ECDSA P-256 key for TLS and a leaf certificate for it that the identity key signs (`tls_material`). A
participant trusts exactly its pins: for each pinned key it builds a trust anchor whose subject names that
key (`anchor_name`) and whose public key is the pinned key, so a peer's leaf verifies iff the pinned
identity issued it, and the TLS handshake proves the peer holds the leaf's private key. The anchors'
own signatures are never relied on (a verifier does not check a trust anchor's self-signature); each is
made with a throwaway key because the pinned participant's private key is not at hand. Who connected is
read back from the verified leaf's issuer (`issuer_of`).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from ..fsio import atomic_write, regular_file
from .errors import SecureMessageError, SecureParameterError

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
PIN_PREFIX = "ed25519:"
TLS_NAME = "falsevfl.peer"  # every leaf's DNS name; identity comes from the issuer, not from the name
_LABEL_PREFIX = b"falsevfl/v1/"
_LEAF_DAYS = 30
_ANCHOR_VALIDITY = (datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC),
                    datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC))
_P = 2**255 - 19  # Ed25519's field (RFC 8032): a pin must decode to a point of its curve
_D = -121665 * pow(121666, -1, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


class IdentityError(SecureMessageError):
    """A key file, pin or signature that cannot be used: the message says which and why."""


PrivateKey = ed25519.Ed25519PrivateKey


def generate() -> PrivateKey:
    """A new identity key from the operating system's entropy."""
    return ed25519.Ed25519PrivateKey.generate()


def public_bytes(key: PrivateKey) -> bytes:
    """The 32-byte raw public key of an identity."""
    return key.public_key().public_bytes_raw()


def write_private_key(path: Path | str, key: PrivateKey) -> None:
    """Write the private key (PKCS#8 PEM) readable by its owner only; an existing key is never replaced."""
    path = Path(path)
    if path.exists():
        raise IdentityError(f"{path} exists (written by an earlier keygen): a key is never replaced; remove it to "
                            "make a new one (every participant must then pin the new line)")
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    staging = path.with_name(f".{path.name}.new")
    staging.unlink(missing_ok=True)
    atomic_write(staging, pem, private=True)
    try:
        os.link(staging, path)  # fails if a key appeared meanwhile (two keygens at once): never replaced
    except FileExistsError:
        raise IdentityError(f"{path} exists (another keygen wrote it just now): a key is never replaced") from None
    finally:
        staging.unlink(missing_ok=True)


def read_private_key(path: Path | str) -> PrivateKey:
    """The identity key in `path`; refused when others may read the file or it is not an Ed25519 key."""
    path = Path(path)
    try:
        data, status = regular_file(path)  # (the mode of the file read, not of one stat'ed before)
        mode = status.st_mode
    except FileNotFoundError:
        raise IdentityError(f"{path}: no identity key (create one with `python -m falsevfl_secure.federation "
                            "keygen`)") from None
    except OSError as error:
        raise IdentityError(f"{path}: cannot read the identity key ({error.strerror})") from None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(f"{path}: the identity key is readable by others (mode {stat.S_IMODE(mode):o}); "
                            f"run `chmod 600 {path}`")
    if not data.strip():
        raise IdentityError(f"{path}: the identity key file is empty (create one with `python -m "
                            "falsevfl_secure.federation keygen`, or restore the party's key)")
    if PIN_PREFIX.encode() in data and b"PRIVATE KEY" not in data:  # (a bad-input sweep pasted the pin line here)
        raise IdentityError(f"{path}: holds a public pin ({PIN_PREFIX}...), which goes in federation.toml; the key "
                            "file is the private key `federation keygen` wrote")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):  # (the library's own text pointed at its FAQ: a sweep found it unreadable)
        raise IdentityError(f"{path}: not a key written by `federation keygen` (no PEM private key in it)") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise IdentityError(f"{path}: the identity key must be Ed25519, got {type(key).__name__}")
    return key


def pin_text(public: bytes) -> str:
    """The value that pins a public key in federation.toml: "ed25519:<base64>"."""
    return PIN_PREFIX + base64.b64encode(_checked_public(public)).decode()


def parse_pin(text: object) -> bytes:
    """The 32-byte public key of a pin written by `pin_text`."""
    if not isinstance(text, str) or not text.startswith(PIN_PREFIX):
        raise IdentityError(f"a key pin must be a string \"{PIN_PREFIX}<base64 of 32 bytes>\", got {text!r}")
    try:
        raw = base64.b64decode(text[len(PIN_PREFIX):], validate=True)
    except ValueError:
        raise IdentityError(f"the key pin {text!r} is not valid base64") from None
    if not on_curve(_checked_public(raw)):
        raise IdentityError(f"the key pin {text!r} is no Ed25519 public key (its bytes are not a point of the "
                            "curve: a mistyped or changed character?); copy the `key = ...` line that participant's "
                            "`federation keygen` printed")
    return raw


def on_curve(public: bytes) -> bool:
    """Whether 32 bytes encode a point of Ed25519 (RFC 8032, 5.1.3): about half of all mistyped pins do not."""
    y = int.from_bytes(public, "little") & ((1 << 255) - 1)
    if y >= _P:
        return False
    x2 = (y * y - 1) * pow(_D * y * y + 1, -1, _P) % _P
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return False
    return x != 0 or not public[31] >> 7


def fingerprint(public: bytes) -> str:
    """A short digest of a public key for people to compare out of band: SHA-256, first 16 bytes in hex."""
    digest = hashlib.sha256(_checked_public(public)).hexdigest()[:32]
    return ":".join(digest[i:i + 4] for i in range(0, 32, 4))


def _checked_public(public: bytes) -> bytes:
    if not isinstance(public, bytes) or len(public) != PUBLIC_KEY_BYTES:
        raise IdentityError(f"an Ed25519 public key has {PUBLIC_KEY_BYTES} bytes, got "
                            f"{len(public) if isinstance(public, bytes) else type(public).__name__}")
    return public


def _labelled(label: str, message: bytes) -> bytes:
    return _LABEL_PREFIX + label.encode() + b"\0" + bytes(message)


def sign(key: PrivateKey, label: str, message: bytes) -> bytes:
    """The identity's signature of `message` for the purpose `label`."""
    return key.sign(_labelled(label, message))


def verify(public: bytes, label: str, message: bytes, signature: bytes, signer: str) -> None:
    """Raise `IdentityError` naming `signer` unless `signature` is `public`'s signature of (label, message)."""
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(_checked_public(public)).verify(
            bytes(signature), _labelled(label, message))
    except (InvalidSignature, ValueError, TypeError):
        raise IdentityError(f"the {label} of {signer} does not carry a valid signature of {signer}'s pinned key "
                            "(a substituted or forged message, or a wrong pin)") from None


# -- TLS credentials bound to the identity ------------------------------------------------------------


def anchor_name(public: bytes) -> x509.Name:
    """The subject of the trust anchor of `public`: derived from the key, so names never collide."""
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                         "falsevfl identity " + hashlib.sha256(public).hexdigest()[:40])])


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes for gRPC: this run's TLS key, its leaf certificate, and the anchors of the trusted pins."""

    private_key: bytes
    certificate: bytes
    trusted: bytes


def tls_material(key: PrivateKey, name: str, trusted: Mapping[str, bytes]) -> TlsMaterial:
    """A fresh ECDSA P-256 TLS key with a leaf certificate issued by the identity `key` for role `name`,
    and trust anchors for exactly the public keys in `trusted` (role name -> pinned key)."""
    if not trusted:
        raise SecureParameterError("TLS needs at least one pinned peer to trust")
    tls_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    leaf = (x509.CertificateBuilder().subject_name(_common_name(name)).issuer_name(anchor_name(public_bytes(key)))
            .public_key(tls_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=_LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_NAME)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, None))
    anchors = b"".join(_anchor(public).public_bytes(serialization.Encoding.PEM) for public in trusted.values())
    private = tls_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    return TlsMaterial(private, leaf.public_bytes(serialization.Encoding.PEM), anchors)


def _common_name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _anchor(public: bytes) -> x509.Certificate:
    """A CA certificate for the pinned key (see the module docstring for why a throwaway key signs it)."""
    name = anchor_name(public)
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(ed25519.Ed25519PublicKey.from_public_bytes(_checked_public(public)))
            .serial_number(int.from_bytes(hashlib.sha256(public).digest()[:8], "big"))
            .not_valid_before(_ANCHOR_VALIDITY[0]).not_valid_after(_ANCHOR_VALIDITY[1])
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(ed25519.Ed25519PrivateKey.generate(), None))


def issuer_of(certificate_pem: bytes, pins: Mapping[str, bytes]) -> str | None:
    """The pinned role whose identity issued a peer's (already verified) leaf certificate, or None.

    The leaf's signature is checked again here against that pin, so a caller never relies on the name alone."""
    try:
        leaf = x509.load_pem_x509_certificate(bytes(certificate_pem))
    except ValueError:
        return None
    for role, public in pins.items():
        if leaf.issuer == anchor_name(public):
            try:
                ed25519.Ed25519PublicKey.from_public_bytes(public).verify(leaf.signature, leaf.tbs_certificate_bytes)
            except InvalidSignature:
                return None
            return role
    return None


__all__ = ["PIN_PREFIX", "PUBLIC_KEY_BYTES", "TLS_NAME", "IdentityError", "PrivateKey", "TlsMaterial",
           "anchor_name", "fingerprint", "generate", "issuer_of", "on_curve", "parse_pin", "pin_text", "public_bytes",
           "read_private_key", "sign", "tls_material", "verify", "write_private_key"]

