"""TLS certificates and SuperNode authentication keys for a fedsolve Flower deployment.

* ``make_tls(dir, hosts)`` writes a private CA (``ca.crt``) and a SuperLink certificate
  (``server.pem`` / ``server.key``) whose subject alternative names cover ``hosts`` (IP
  addresses or DNS names the SuperNodes and the ``flwr`` CLI use to reach the SuperLink).
  SuperLink: ``--ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile server.key``;
  SuperNodes: ``--root-certificates ca.crt``; ``flwr`` CLI: ``root-certificates`` in the
  connection of ``$FLWR_HOME/config.toml``.
* ``make_node_keys(dir, names)`` writes one EC P-384 key pair per SuperNode in OpenSSH format
  (``<name>`` private, ``<name>.pub`` public), the format Flower 1.41-1.42 expects: the SuperNode
  gets ``--auth-supernode-private-key <name>``, and the public key is registered on the
  SuperLink with ``flwr supernode register <name>.pub <connection>`` (SuperLink started with
  ``--enable-supernode-auth``; unregistered nodes are refused).

Uses the ``cryptography`` package (a dependency of flwr). Keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def make_tls(
    out_dir: str | Path, hosts: Iterable[str] = ("127.0.0.1", "localhost"), days: int = 365
) -> dict[str, Path]:
    """Write ``ca.crt``, ``ca.key``, ``server.pem``, ``server.key`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hosts = list(hosts)
    now = _dt.datetime.now(_dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsolve Flower CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    pk = (pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())  # encoding, format, encryption
    paths = {
        "ca_cert": out / "ca.crt",
        "ca_key": out / "ca.key",
        "server_cert": out / "server.pem",
        "server_key": out / "server.key",
    }
    _write(paths["ca_cert"], ca.public_bytes(pem))
    _write(paths["ca_key"], ca_key.private_bytes(*pk), private=True)
    _write(paths["server_cert"], cert.public_bytes(pem))
    _write(paths["server_key"], key.private_bytes(*pk), private=True)
    return paths


def make_node_keys(out_dir: str | Path, names: Iterable[str]) -> dict[str, tuple[Path, Path]]:
    """One OpenSSH EC P-384 key pair per SuperNode: ``{name: (private key, public key)}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = {}
    for n in names:
        k = ec.generate_private_key(ec.SECP384R1())
        priv, pub = out / n, out / f"{n}.pub"
        _write(
            priv,
            k.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            ),
            private=True,
        )
        _write(
            pub, k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
        )
        res[n] = (priv, pub)
    return res
