"""TLS for courier's framed protocol over TCP, with Python's ``ssl``: contexts, handshakes, and
the lock each TLS socket carries (:func:`wrap`).

A TLS server of courier offers two application protocols (ALPN): ``courier`` for
courier's own clients, which speak the framed protocol, and ``h2`` for gRPC clients,
whose connections the server relays to its gRPC service (:mod:`.relay`). A courier
client offers only ``courier``; a server that does not select it (a server that only
speaks gRPC) is called over gRPC instead. Certificates are verified as gRPC does:
against ``root_certificates`` (or the system's roots), for the host of the address or
``TLSConfig.server_name``; a server with ``root_certificates`` requires client
certificates signed by them (mutual TLS).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import tempfile
import threading
from typing import Any, Optional

from courier import security

COURIER = 'courier'
HTTP2 = ('h2', 'grpc-exp')  # What gRPC clients offer.
# Preferred first: a server selects the first of these its client offers.
SERVER_PROTOCOLS = [COURIER, *HTTP2]

# What a non-blocking TLS socket raises when it must wait for the network.
WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
Error = ssl.SSLError
CLOSED = ssl.SSLZeroReturnError  # The peer ended TLS (close_notify).
CertificateError = ssl.SSLCertVerificationError  # The peer's certificate is not trusted.


def server_context(config: security.TLSConfig) -> ssl.SSLContext:
    """The context of a server with ``config``'s certificate (and client CA, for mutual TLS).

    Raises:
      ValueError: the configuration has no certificate, or it cannot be loaded.
    """
    if config.certificate_chain is None:
        raise ValueError('a TLS server needs TLSConfig(certificate_chain=..., private_key=...)')
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, config, 'server')
    if config.root_certificates is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        _load_roots(context, config)
    context.set_alpn_protocols(SERVER_PROTOCOLS)
    return context


def client_context(config: security.TLSConfig) -> ssl.SSLContext:
    """The context of a client: verifies the server, presents a certificate if it has one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.root_certificates is not None:
        _load_roots(context, config)
    else:
        context.load_default_certs()
    if config.certificate_chain is not None:
        _load_chain(context, config, 'client')
    context.set_alpn_protocols([COURIER])
    return context


def wrap(context: ssl.SSLContext, sock: socket.socket, **options: Any) -> ssl.SSLSocket:
    """``context.wrap_socket(sock, **options)``, with the lock its reads and writes take.

    OpenSSL lets one thread at a time use a connection (two at once corrupt its state: a write
    fails with SSLEOFError or 'bad length'), and Python's ``ssl`` takes no lock around them. So
    a TLS socket that two threads use, a server's (its loop reads while workers send answers)
    or a futures client's (its reader thread reads while callers send), is non-blocking, and
    each SSL read and write of it holds ``sock.courier_lock``; the waits for the network
    between them do not (:mod:`.frames`). A blocking one serves one thread at a time.
    """
    sock = context.wrap_socket(sock, **options)
    sock.courier_lock = threading.Lock()
    return sock


def server_name(config: security.TLSConfig, host: str) -> str:
    """The name the server's certificate must carry: ``server_name``, else the address's host."""
    return config.server_name or host


def handshake(sock: ssl.SSLSocket) -> Optional[str]:
    """Advances a non-blocking server-side handshake.

    Returns None once it is done, else 'read' or 'write': what it waits for.

    Raises:
      OSError: the handshake failed (``ssl.SSLError`` included); the connection is lost.
    """
    try:
        sock.do_handshake()
    except ssl.SSLWantReadError:
        return 'read'
    except ssl.SSLWantWriteError:
        return 'write'
    return None


def speaks_http2(sock: ssl.SSLSocket) -> bool:
    """Whether the peer of a finished handshake chose gRPC's HTTP/2."""
    return sock.selected_alpn_protocol() in HTTP2


def _load_roots(context: ssl.SSLContext, config: security.TLSConfig) -> None:
    try:
        context.load_verify_locations(cadata=config.root_certificates.decode('ascii'))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f'TLSConfig.root_certificates cannot be loaded: {error}; they must be '
                         f'PEM certificates') from None


def _load_chain(context: ssl.SSLContext, config: security.TLSConfig, side: str) -> None:
    """Loads the certificate and key: Python's ``ssl`` reads them only from files, so they
    go through a private temporary directory that is removed at once."""
    directory = tempfile.mkdtemp(prefix='courier-tls-')
    try:
        chain = os.path.join(directory, 'chain.pem')
        key = os.path.join(directory, 'key.pem')
        for path, data in ((chain, config.certificate_chain), (key, config.private_key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), 'wb') as out:
                out.write(data)
        context.load_cert_chain(chain, key)
    except ssl.SSLError as error:
        raise ValueError(f"the {side}'s TLSConfig.certificate_chain and private_key cannot be "
                         f'loaded ({error}); they must be a PEM certificate chain and its key'
                         ) from None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
