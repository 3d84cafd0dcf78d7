"""What a process needs to join a protected cluster: a token and/or TLS credentials.

Servers and clients only pass a :class:`Security` to the comm layer, which does the
rest: the token proof (:mod:`shoal.comm.handshake`) on every connection, TLS for
``tls://`` addresses, and the refusal of plain ``tcp://`` when encryption is required.

TLS is mutual: a listener requires a certificate signed by the cluster's CA, and a
connector verifies the listener's certificate against the same CA. Host names are
not checked: the CA is private to the cluster, so holding a certificate it signed is
what makes a process a member; workers are reached by whatever address they report
(often a bare IP on a compute node), which a shared cluster certificate cannot name.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import ipaddress
import os
import secrets
import shutil
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV_TOKEN = "SHOAL_TOKEN"
ENV_TLS_CA_FILE = "SHOAL_TLS_CA_FILE"
ENV_TLS_CERT = "SHOAL_TLS_CERT"
ENV_TLS_KEY = "SHOAL_TLS_KEY"
ENV_REQUIRE_ENCRYPTION = "SHOAL_REQUIRE_ENCRYPTION"
ENV_VARS = (ENV_TOKEN, ENV_TLS_CA_FILE, ENV_TLS_CERT, ENV_TLS_KEY, ENV_REQUIRE_ENCRYPTION)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def generate_token() -> str:
    return secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True)
class Security:
    """``token``: every connection proves it knows this (HMAC over nonces).
    ``tls_ca_file``, ``tls_cert``, ``tls_key``: PEM files for ``tls://`` (the key may be
    in the certificate file). ``require_encryption``: refuse plain ``tcp://``."""

    token: str | None = dataclasses.field(default=None, repr=False)
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    require_encryption: bool = False

    def __post_init__(self) -> None:
        if self.token is not None and not self.token:
            raise ValueError("a cluster token may not be empty (use None for no token)")
        given = {
            "tls_ca_file": self.tls_ca_file,
            "tls_cert": self.tls_cert,
        }
        if self.tls_ca_file or self.tls_cert or self.tls_key:
            missing = [name for name, value in given.items() if not value]
            if missing:
                raise ValueError(f"TLS needs {' and '.join(missing)} as well")
        if self.require_encryption and not self.tls:
            raise ValueError(
                "require_encryption needs TLS credentials (tls_ca_file, tls_cert, tls_key)"
            )

    def __repr__(self) -> str:  # never show the token itself
        fields = [f"token={'<set>' if self.token else None}"]
        fields += [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name != "token" and getattr(self, f.name)
        ]
        return f"Security({', '.join(fields)})"

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca_file and self.tls_cert)

    @property
    def scheme(self) -> str:
        """The scheme this side's listeners use."""
        return "tls" if self.tls else "tcp"

    # ------------------------------------------------------------ environment

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Security:
        """``SHOAL_TOKEN``, ``SHOAL_TLS_CA_FILE``, ``SHOAL_TLS_CERT``, ``SHOAL_TLS_KEY``,
        ``SHOAL_REQUIRE_ENCRYPTION`` (1/true/yes)."""
        env = os.environ if environ is None else environ
        flag = env.get(ENV_REQUIRE_ENCRYPTION, "").strip().lower()
        if flag not in _TRUE | _FALSE:
            raise ValueError(
                f"{ENV_REQUIRE_ENCRYPTION}={flag!r}: expected 1/true/yes or 0/false/no"
            )
        return cls(
            token=env.get(ENV_TOKEN) or None,
            tls_ca_file=env.get(ENV_TLS_CA_FILE) or None,
            tls_cert=env.get(ENV_TLS_CERT) or None,
            tls_key=env.get(ENV_TLS_KEY) or None,
            require_encryption=flag in _TRUE,
        )

    def to_env(self) -> dict[str, str]:
        """Every variable ``from_env`` reads (empty when unset, so a child's copy of the
        parent's environment cannot add a setting we do not have)."""
        return {
            ENV_TOKEN: self.token or "",
            ENV_TLS_CA_FILE: self.tls_ca_file or "",
            ENV_TLS_CERT: self.tls_cert or "",
            ENV_TLS_KEY: self.tls_key or "",
            ENV_REQUIRE_ENCRYPTION: "1" if self.require_encryption else "",
        }

    def with_token(self, token: str | None) -> Security:
        return dataclasses.replace(self, token=token)

    # ------------------------------------------------------------ TLS

    @functools.cached_property
    def server_context(self) -> ssl.SSLContext:
        """For listeners: present our certificate, require the peer's."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self._ca_file())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_cert_chain(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    @functools.cached_property
    def client_context(self) -> ssl.SSLContext:
        """For connectors: verify the server against the CA, present our certificate."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self._ca_file())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False  # membership is the CA's signature (module docstring)
        ctx.verify_mode = ssl.CERT_REQUIRED
        self._load_cert_chain(ctx)
        return ctx

    def _load_cert_chain(self, ctx: ssl.SSLContext) -> None:
        try:
            ctx.load_cert_chain(str(self.tls_cert), self.tls_key)
        except (ssl.SSLError, OSError) as e:
            key = f" with key {self.tls_key}" if self.tls_key else " (key in the same file)"
            raise ValueError(f"cannot load TLS certificate {self.tls_cert}{key}: {e}") from e

    def _ca_file(self) -> str:
        if not self.tls:
            raise ValueError(
                "tls:// needs TLS credentials: tls_ca_file, tls_cert and tls_key "
                f"(or {ENV_TLS_CA_FILE}, {ENV_TLS_CERT}, {ENV_TLS_KEY})"
            )
        ca = str(self.tls_ca_file)
        if not os.path.isfile(ca):
            raise ValueError(f"TLS CA file {ca} does not exist")
        return ca

    def listen_context(self) -> ssl.SSLContext | None:
        """The context for a new listener (None: plain tcp)."""
        if self.require_encryption and not self.tls:  # pragma: no cover - __post_init__
            raise ValueError("require_encryption: refusing to listen on plain tcp://")
        return self.server_context if self.tls else None

    def connect_context(self, scheme: str, address: str) -> ssl.SSLContext | None:
        """The context for connecting to ``address`` (None: plain tcp)."""
        if scheme == "tls":
            return self.client_context
        if self.require_encryption:
            raise ValueError(
                f"refusing to connect to {address}: encryption is required "
                "and tcp:// is plain text (use the tls:// address)"
            )
        return None

    @classmethod
    def temporary(
        cls, token: str | None = None, directory: str | None = None, hosts: Sequence[str] = ()
    ) -> Security:
        """Throwaway credentials for this machine: a new CA and one certificate it signed
        for 127.0.0.1/::1/localhost and the IP addresses ``hosts`` (other hosts of a
        cluster), used by every process (mutual TLS, encryption required). The files are
        deleted when this process exits."""
        if directory is None:
            directory = tempfile.mkdtemp(prefix="shoal-tls-")
            atexit.register(shutil.rmtree, directory, True)
        os.makedirs(directory, exist_ok=True)
        ca, cert, key = _write_temporary_credentials(Path(directory), hosts)
        return cls(token, str(ca), str(cert), str(key), require_encryption=True)


def _write_temporary_credentials(
    directory: Path, hosts: Sequence[str] = ()
) -> tuple[Path, Path, Path]:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("Security.temporary() needs the 'cryptography' package") from e
    import datetime

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=7)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name(f"shoal temporary CA {secrets.token_hex(4)}")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        *(x509.IPAddress(ipaddress.ip_address(host)) for host in hosts),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("shoal"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(ca_cert.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    fd = os.open(paths[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # private to us
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
    return paths
