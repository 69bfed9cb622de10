"""A certificate authority with server and client certificates, made at test time."""
from __future__ import annotations

import datetime
import ipaddress
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class Pki:
    """A CA (`ca_pem`), a server certificate for `ips` and 'localhost', and a client certificate.

    Keys and certificates are PEM bytes: `server_key`/`server_pem`, `client_key`/`client_pem`.
    """

    def __init__(self, ips: Sequence[str] = ('127.0.0.1',)):
        now = datetime.datetime.now(datetime.timezone.utc)
        self.ca_key, self.ca_pem = self._certificate('launchpad test CA', now, ca=True)
        sans = [x509.DNSName('localhost')] + [x509.IPAddress(ipaddress.ip_address(ip))
                                              for ip in ips]
        self.server_key, self.server_pem = self._certificate('localhost', now, sans=sans)
        self.client_key, self.client_pem = self._certificate('launchpad client', now)

    def _certificate(self, name, now, ca=False, sans=None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (x509.CertificateBuilder()
                   .subject_name(subject)
                   .issuer_name(subject if ca else self.ca_name)
                   .public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        certificate = builder.sign(key if ca else self.ca_signing_key, hashes.SHA256())
        if ca:
            self.ca_name, self.ca_signing_key = subject, key
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return key_pem, certificate.public_bytes(serialization.Encoding.PEM)
