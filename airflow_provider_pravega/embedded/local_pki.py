"""Throw-away certificates for TLS tests: a CA and a server certificate for localhost/127.0.0.1.

RSA 2048 with SHA-256 and version-3 extensions (basic constraints, key usage, SANs), because the
official client's TLS stack (rustls/webpki) refuses certificates without SANs or with a CA used as
an end-entity certificate. Valid for one day.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, load_pem_private_key, pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TestPKI:
    """Paths of the PEM files :func:`make_test_pki` wrote."""

    __test__ = False  # not a pytest test class

    ca_cert: Path
    server_cert: Path
    server_key: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "airflow-provider-pravega tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_test_pki(directory: str | os.PathLike[str], *, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                  ca_name: str = "pravega-test-ca", client_auth: bool = False) -> TestPKI:
    """Write ``ca.pem``, ``server.pem`` and ``server-key.pem`` (unencrypted, mode 0600) into
    ``directory`` and return their paths. ``hosts`` become the server certificate's SANs.
    ``client_auth`` lets the certificate also serve as a TLS client certificate (Pravega
    standalone's ZooKeeper uses the server certificate for mutual TLS)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=1)

    ca_key = _key()
    ca_subject = _name(ca_name)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = _key()
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]
                                             + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else [])),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    pki = TestPKI(out / "ca.pem", out / "server.pem", out / "server-key.pem")
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_pem = server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())
    fd = os.open(pki.server_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
    return pki


def make_java_stores(pki: TestPKI, directory: str | os.PathLike[str], java: str) -> tuple[Path, Path, Path]:
    """JKS key and trust stores made from ``pki`` with the ``keytool`` next to ``java``, plus the file
    holding their password: Pravega standalone insists on them with TLS (its ZooKeeper uses mutual TLS).

    Returns ``(key_store, trust_store, password_file)``.
    """
    work = Path(directory)
    password = "test-store-password"
    pwd_file = work / "stores.pwd"
    pwd_file.write_text(password)
    p12 = work / "server.p12"
    p12.write_bytes(pkcs12.serialize_key_and_certificates(
        b"server", load_pem_private_key(pki.server_key.read_bytes(), None),
        x509.load_pem_x509_certificate(pki.server_cert.read_bytes()),
        [x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())], BestAvailableEncryption(password.encode())))
    keytool = str(Path(java).parent / "keytool")
    key_store, trust_store = work / "server.jks", work / "trust.jks"
    subprocess.run([keytool, "-importkeystore", "-srckeystore", str(p12), "-srcstoretype", "PKCS12",
                    "-srcstorepass", password, "-destkeystore", str(key_store), "-deststoretype", "JKS",
                    "-deststorepass", password, "-noprompt"], check=True, capture_output=True, timeout=120)
    subprocess.run([keytool, "-importcert", "-file", str(pki.ca_cert), "-alias", "ca", "-keystore", str(trust_store),
                    "-storetype", "JKS", "-storepass", password, "-noprompt"], check=True, capture_output=True,
                   timeout=120)
    return key_store, trust_store, pwd_file
