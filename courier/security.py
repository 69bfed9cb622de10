"""Who may talk to a courier server: the shared auth token and TLS settings.

A courier call runs a pickle on the server, so anyone who can call a server can
run code there. Servers reachable from other hosts should require an auth token
(``auth_token=`` or the ``COURIER_AUTH_TOKEN`` environment variable, which
launchers set for every process of a program) and use TLS between hosts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Union

AUTH_TOKEN_ENV = 'COURIER_AUTH_TOKEN'

PemSource = Union[bytes, str, 'os.PathLike[str]']


def resolve_auth_token(token: Optional[str]) -> Optional[str]:
    """Returns ``token``, or when it is None the ``COURIER_AUTH_TOKEN`` env var (or None).

    Raises:
      ValueError: the token is empty or not printable ASCII (the gRPC metadata
        of gRPC clients cannot carry it).
    """
    if token is None:
        token = os.environ.get(AUTH_TOKEN_ENV) or None
        source = f'environment variable {AUTH_TOKEN_ENV}'
    else:
        source = 'auth_token'
    if token is None:
        return None
    if not isinstance(token, str):
        raise TypeError(f'{source} must be a str, got {type(token).__name__}')
    if not token or not token.isascii() or not token.isprintable():
        raise ValueError(f'{source} must be a non-empty string of printable ASCII '
                         f'characters (gRPC clients send it as metadata)')
    return token


@dataclasses.dataclass(frozen=True)
class TLSConfig:
    """TLS credentials for a ``courier.Server`` or ``courier.Client``.

    Each field takes PEM data as ``bytes``, PEM text as a ``str`` starting with
    ``-----BEGIN``, or the path of a PEM file (read at construction).

    Attributes:
      certificate_chain: The server's certificate chain (required on a server);
        on a client, its certificate for mutual TLS.
      private_key: The key of ``certificate_chain``.
      root_certificates: CA certificates that verify the peer. On a client they
        verify the server (None: the system's roots). On a server, setting them
        requires every client to present a certificate they signed (mutual TLS).
      server_name: On a client, the name the server's certificate must carry when
        it differs from the host in the address (e.g. connecting by IP).
    """

    certificate_chain: Optional[bytes] = None
    private_key: Optional[bytes] = None
    root_certificates: Optional[bytes] = None
    server_name: Optional[str] = None

    def __post_init__(self):
        for field in ('certificate_chain', 'private_key', 'root_certificates'):
            object.__setattr__(self, field, _read_pem(getattr(self, field), field))
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError('TLSConfig needs both certificate_chain and private_key, '
                             'or neither')

    def __repr__(self) -> str:  # Never print key material.
        shown = [f'{field}=<{len(value)} bytes>' for field, value in
                 (('certificate_chain', self.certificate_chain),
                  ('private_key', self.private_key),
                  ('root_certificates', self.root_certificates)) if value is not None]
        if self.server_name is not None:
            shown.append(f'server_name={self.server_name!r}')
        return f'TLSConfig({", ".join(shown)})'


def _read_pem(source: Optional[PemSource], field: str) -> Optional[bytes]:
    if source is None or isinstance(source, bytes):
        return source
    if isinstance(source, str) and source.lstrip().startswith('-----BEGIN'):
        return source.encode()
    if isinstance(source, (str, os.PathLike)):
        with open(source, 'rb') as pem_file:
            return pem_file.read()
    raise TypeError(f'TLSConfig.{field} must be PEM bytes, PEM text or a file path, '
                    f'got {type(source).__name__}')
