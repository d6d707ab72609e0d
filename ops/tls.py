"""A local certificate authority for the demo and the tests: one CA, then a certificate per component.

Made with the `cryptography` package (no `openssl` subprocess). Certificates are ECDSA P-256, valid for the
names and loopback addresses given; each is usable both as a server and as a client certificate (mTLS),
because the platform's components are both (squeal reads from MariaDB and writes to routers). Tests make
the bad cases with the same calls: another CA (wrong CA), `not_after` in the past (expired), a name list
without the address dialled (hostname mismatch).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class CertPair:
    """A PEM certificate and its private key on disk (the key is mode 0600)."""

    cert: Path
    key: Path

    def load_cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert.read_bytes())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_pair(directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertPair:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return CertPair(cert_path, key_path)


def make_ca(directory: Path, name: str = "ca", common_name: str = "squeal local CA", days: int = 3650) -> CertPair:
    """Create a self-signed CA as `<directory>/<name>.crt` and `.key`."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write_pair(directory, name, cert, key)


def issue(
    ca: CertPair,
    directory: Path,
    name: str,
    hosts: tuple[str, ...] | list[str] = DEFAULT_HOSTS,
    days: int = 825,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> CertPair:
    """Issue `<directory>/<name>.crt` and `.key`, signed by `ca`, for `hosts` (DNS names or IP addresses).

    The common name is `name`; it is also the identity a peer sees in a client certificate.
    `not_before`/`not_after` override the validity window (an expired certificate for a test)."""
    ca_cert = ca.load_cert()
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key}: not an EC private key made by ops.tls.make_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    start = not_before or now - datetime.timedelta(minutes=5)
    end = not_after or now + datetime.timedelta(days=days)
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _write_pair(directory, name, cert, key)


def expires_at(cert_path: Path) -> datetime.datetime:
    """When the (first) certificate in a PEM file stops being valid, in UTC; for the expiry metric."""
    return x509.load_pem_x509_certificate(cert_path.read_bytes()).not_valid_after_utc


def issue_for_components(
    directory: Path, components: tuple[str, ...] | list[str], hosts: tuple[str, ...] | list[str]
) -> CertPair:
    """The layout a topology's `[tls] dir` reads (`<directory>/ca.crt`, `<directory>/<component>.crt` + `.key`):
    the CA — kept if `ca.crt` and `ca.key` are already there, so a deployment's certificates stay in one chain
    across `up`s — and a fresh certificate for each component, valid for every host of `hosts`. Returns the CA."""
    ca_files = CertPair(directory / "ca.crt", directory / "ca.key")
    ca = ca_files if ca_files.cert.is_file() and ca_files.key.is_file() else make_ca(directory)
    for component in components:
        issue(ca, directory, component, hosts=tuple(dict.fromkeys(hosts)))
    return ca
