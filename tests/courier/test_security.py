"""Auth tokens and TLS: who may call a courier server.

Every test that serves runs twice on the server's TCP port: its clients speaking courier's
framed protocol (the fast lane between hosts), and speaking gRPC (relayed to the server's
gRPC service, under TLS chosen by ALPN).
"""

from __future__ import annotations

import pickle
import socket
import ssl
import threading

import numpy as np
import pytest

import courier
from courier.transport import frames
from courier.transport import tls
from tests.core.conftest import wait_until
from tests.courier.conftest import hello_frame, serve_add, speak_grpc
from tests.pki import Pki


def pytest_generate_tests(metafunc):
    if 'make_server' in metafunc.fixturenames:
        metafunc.parametrize('lane', ['framed', 'grpc'], indirect=True)


@pytest.fixture(autouse=True)
def lane(request, monkeypatch):
    """The protocol this test's clients speak: 'framed', or 'grpc'."""
    lane = getattr(request, 'param', 'framed')
    if lane == 'grpc':
        speak_grpc(monkeypatch)
    return lane


@pytest.fixture(autouse=True)
def no_token_in_environment(monkeypatch):
    monkeypatch.delenv(courier.AUTH_TOKEN_ENV, raising=False)


def test_call_without_token_is_refused(make_server):
    server = serve_add(make_server, auth_token='s3cret')
    client = courier.Client(server.address, call_timeout=10)
    with pytest.raises(courier.PermissionDeniedError) as info:
        client.add(1, 2)
    assert isinstance(info.value, PermissionError)
    message = str(info.value)
    assert 'carried none' in message and courier.AUTH_TOKEN_ENV in message
    assert "'add'" in message and server.address in message
    with pytest.raises(courier.PermissionDeniedError):
        courier.list_methods(client)
    with pytest.raises(courier.PermissionDeniedError):
        client.futures.add(1, 2).result(timeout=10)


def test_call_with_wrong_token_is_refused(make_server):
    server = serve_add(make_server, auth_token='s3cret')
    client = courier.Client(server.address, call_timeout=10, auth_token='guess')
    with pytest.raises(courier.PermissionDeniedError, match='wrong auth token'):
        client.add(1, 2)


def test_call_with_the_token_succeeds(make_server, lane):
    server = serve_add(make_server, auth_token='s3cret')
    client = courier.Client(server.address, auth_token='s3cret')
    assert client.add(1, 2) == 3
    assert client.protocol == lane
    assert courier.list_methods(client) == ['add']


def test_environment_supplies_the_token_to_server_and_client(make_server, monkeypatch):
    monkeypatch.setenv(courier.AUTH_TOKEN_ENV, 'from-env')
    server = serve_add(make_server)
    assert courier.Client(server.address).add(2, 2) == 4
    with pytest.raises(courier.PermissionDeniedError):
        courier.Client(server.address, auth_token='other').add(2, 2)


def test_explicit_token_travels_with_a_pickled_client(make_server):
    import pickle  # pylint: disable=import-outside-toplevel
    server = serve_add(make_server, auth_token='s3cret')
    client = pickle.loads(pickle.dumps(courier.Client(server.address, auth_token='s3cret')))
    assert client.add(3, 3) == 6


def test_server_without_token_accepts_clients_with_one(make_server):
    server = serve_add(make_server)
    assert courier.Client(server.address, auth_token='unneeded').add(1, 1) == 2


@pytest.mark.parametrize('token', ['', 'new\nline', 'ünïcode'])
def test_unusable_tokens_are_refused(token):
    with pytest.raises(ValueError, match='printable ASCII'):
        courier.Server(auth_token=token)
    with pytest.raises(ValueError, match='printable ASCII'):
        courier.Client('localhost:1', auth_token=token)


@pytest.fixture(scope='module')
def pki():
    return Pki()


def test_tls_round_trip(make_server, pki, lane):
    server = serve_add(make_server, tls=courier.TLSConfig(
        certificate_chain=pki.server_pem, private_key=pki.server_key))
    client = courier.Client(server.address, call_timeout=10,
                            tls=courier.TLSConfig(root_certificates=pki.ca_pem))
    assert client.add(40, 2) == 42
    assert client.futures.add(1, 2).result(timeout=10) == 3
    assert client.protocol == lane
    # A plaintext client cannot talk to a TLS server.
    with pytest.raises(courier.CourierError):
        courier.Client(server.address, call_timeout=2, wait_for_ready=False).add(1, 1)


def test_tls_carries_large_arrays_both_ways(make_server, pki, lane):
    server = make_server(tls=courier.TLSConfig(certificate_chain=pki.server_pem,
                                               private_key=pki.server_key))
    server.Bind('twice', lambda array: array * 2)
    server.Start()
    client = courier.Client(server.address, call_timeout=60,
                            tls=courier.TLSConfig(root_certificates=pki.ca_pem))
    array = np.arange(6 << 20, dtype=np.int32)  # 24 MiB: many TLS records, buffers filled up.
    assert np.array_equal(client.twice(array), array * 2)
    futures = [client.futures.twice(array[:1 << 20] + i) for i in range(4)]
    for i, future in enumerate(futures):
        assert np.array_equal(future.result(), (array[:1 << 20] + i) * 2)


def test_a_tls_server_socket_is_read_only_while_no_answer_is_being_sent():
    """OpenSSL lets one thread at a time use a connection: a server's loop reading its TLS
    socket, or asking what it holds, while a worker sends an answer on it ends the connection
    at random (SSLEOFError, 'bad length'; a CI failure). Both wait until the send returned. The
    lock comes with the socket (tls.wrap): a send needs no reader made before it."""
    near, far = socket.socketpair()
    sock = tls.wrap(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), near, server_side=True,
                    do_handshake_on_connect=False)
    try:
        sock.setblocking(False)
        sending, release = threading.Event(), threading.Event()
        overlaps, outcomes = [], []

        def send(data):  # An SSL_write that takes its time.
            sending.set()
            release.wait(10)
            sending.clear()
            return len(data)

        def recv_into(view):  # An SSL_read that finds nothing yet.
            if sending.is_set():
                overlaps.append('SSL_read')
            raise ssl.SSLWantReadError()

        def pending():
            if sending.is_set():
                overlaps.append('SSL_pending')
            return 0

        sock.send, sock.recv_into, sock.pending = send, recv_into, pending
        sender = _recording_thread(outcomes, frames.send, sock, [b'answer'])
        assert sending.wait(10)
        reader = frames.FrameReader(sock)
        loop = [_recording_thread(outcomes, _read_without_waiting, reader),
                _recording_thread(outcomes, lambda: reader.buffered)]
        # Without the lock they come at once (with it: never).
        assert not wait_until(lambda: overlaps, 2), f'{overlaps} while an answer was sent'
        release.set()
        for thread in [sender, *loop]:
            thread.join(10)
        # The send returned, nothing was buffered, and no frame came yet.
        assert sorted(map(str, outcomes)) == ['False', 'None', 'no bytes for now']
    finally:
        sock.close()
        far.close()


def _recording_thread(outcomes: list, function, *args) -> threading.Thread:
    """Runs ``function(*args)`` on a thread that appends what it returned or raised."""
    def run():
        try:
            outcomes.append(function(*args))
        except Exception as error:  # pylint: disable=broad-except
            outcomes.append(error)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _read_without_waiting(reader: frames.FrameReader) -> None:
    reader.read_frame(wait=False)


def test_a_tls_futures_client_sends_no_call_while_its_reader_thread_reads(pki, monkeypatch):
    """A futures connection's reader thread waits for answers while callers send calls on it.
    Over TLS (OpenSSL: one thread at a time in a connection) it must not wait inside an SSL read,
    as a blocking socket does: a caller's send would then always run beside it."""
    reads = {'running': 0, 'started': 0, 'started_at_last_bytes': 0}  # The client's reads.
    overlaps = []
    receive, send = ssl.SSLSocket.recv_into, ssl.SSLSocket.send

    def watched_receive(sock, *args, **kwargs):
        if sock.server_side:
            return receive(sock, *args, **kwargs)
        reads['started'] += 1  # Only the reader thread receives (futures only, here).
        started = reads['started']
        reads['running'] += 1
        try:
            count = receive(sock, *args, **kwargs)
        finally:
            reads['running'] -= 1
        if count:
            reads['started_at_last_bytes'] = started
        return count

    def watched_send(sock, data, *args):
        if not sock.server_side and reads['running']:
            overlaps.append(len(data))
        return send(sock, data, *args)

    monkeypatch.setattr(ssl.SSLSocket, 'recv_into', watched_receive)
    monkeypatch.setattr(ssl.SSLSocket, 'send', watched_send)
    server = courier.Server(tls=courier.TLSConfig(certificate_chain=pki.server_pem,
                                                  private_key=pki.server_key))
    try:
        server.Bind('add', lambda x, y: x + y)
        server.Start()
        client = courier.Client(server.address, call_timeout=10, protocol='framed',
                                tls=courier.TLSConfig(root_certificates=pki.ca_pem))
        assert client.futures.add(1, 2).result() == 3
        # The reader thread took the answer and went back to waiting for the next one.
        assert wait_until(lambda: reads['started'] > reads['started_at_last_bytes'], 10)
        assert client.futures.add(2, 3).result() == 5
        assert client.futures.add(3, 4).result() == 7
        assert not overlaps, f'sends of {overlaps} bytes ran beside an SSL read'
    finally:
        server.Stop()


def test_a_tls_futures_client_lets_go_of_its_reader_thread_when_closed_or_dropped(pki):
    """Its reader thread waits for answers in a poll (see above), which its connection's close
    must end, with a call in flight or none."""
    import gc  # pylint: disable=import-outside-toplevel
    server = courier.Server(tls=courier.TLSConfig(certificate_chain=pki.server_pem,
                                                  private_key=pki.server_key))
    held = threading.Event()
    try:
        server.Bind('add', lambda x, y: x + y)
        server.Bind('held', lambda: held.wait(30))
        server.Start()
        tls_config = courier.TLSConfig(root_certificates=pki.ca_pem)
        warm = courier.Client(server.address, call_timeout=30, protocol='framed', tls=tls_config)
        assert warm.futures.add(1, 1).result() == 2
        closed = courier.Client(server.address, call_timeout=30, protocol='framed',
                                tls=tls_config)
        assert closed.futures.add(1, 2).result() == 3
        in_flight = closed.futures.held()
        closed.close()
        with pytest.raises(courier.ServerUnavailableError, match='closed'):
            in_flight.result(timeout=30)
        dropped = courier.Client(server.address, call_timeout=30, protocol='framed',
                                 tls=tls_config)
        assert dropped.futures.add(2, 3).result() == 5
        del dropped
        gc.collect()
        # Only warm's is left.
        assert wait_until(lambda: _reader_threads(server.address) == 1, 20), (
            _reader_threads(server.address))
    finally:
        held.set()
        server.Stop()


def _reader_threads(address: str) -> int:
    """The futures reader threads of clients of ``address`` (other tests' may still run)."""
    return sum(thread.name == f'courier-client {address}' for thread in threading.enumerate())


def test_tls_clients_silent_in_the_middle_of_a_frame_hold_no_worker(make_server, pki):
    server = serve_add(make_server, thread_pool_size=2, stall_timeout=3, tls=courier.TLSConfig(
        certificate_chain=pki.server_pem, private_key=pki.server_key))
    context = tls.client_context(courier.TLSConfig(root_certificates=pki.ca_pem))  # ALPN courier
    host, port = server.address.rsplit(':', 1)
    call = b''.join(frames.encode(frames.CALL, 0, 1, b'add', pickle.dumps(((1, 2), {}))))
    stalled = []
    try:
        for mode in [frames.SYNC, frames.PIPELINED] * 3:
            sock = context.wrap_socket(socket.create_connection((host, int(port)), timeout=20),
                                       server_hostname='localhost')
            stalled.append(sock)
            sock.sendall(hello_frame(mode=mode) + call[:20])
            assert frames.HEADER.unpack(sock.recv(frames.HEADER.size))[0] == frames.WELCOME
        client = courier.Client(server.address, call_timeout=10,
                                tls=courier.TLSConfig(root_certificates=pki.ca_pem))
        assert client.add(1, 2) == 3 and client.futures.add(2, 3).result() == 5
        for sock in stalled:  # Dropped after stall_timeout, told why.
            fault = sock.recv(4096)
            assert frames.HEADER.unpack(fault[:frames.HEADER.size])[0] == frames.FAULT
            assert b'stall_timeout' in fault
    finally:
        for sock in stalled:
            sock.close()


def test_tls_client_rejects_a_server_it_does_not_trust(make_server, pki):
    server = serve_add(make_server, tls=courier.TLSConfig(
        certificate_chain=pki.server_pem, private_key=pki.server_key))
    untrusted = Pki()  # Another CA.
    client = courier.Client(server.address, call_timeout=5, wait_for_ready=False,
                            tls=courier.TLSConfig(root_certificates=untrusted.ca_pem))
    with pytest.raises(courier.ServerUnavailableError):
        client.add(1, 1)


def test_mutual_tls_requires_a_client_certificate(make_server, pki, tmp_path, lane):
    server = serve_add(make_server, tls=courier.TLSConfig(
        certificate_chain=pki.server_pem, private_key=pki.server_key,
        root_certificates=pki.ca_pem))
    without_certificate = courier.Client(
        server.address, call_timeout=5, wait_for_ready=False,
        tls=courier.TLSConfig(root_certificates=pki.ca_pem))
    with pytest.raises(courier.ServerUnavailableError):
        without_certificate.add(1, 1)
    # PEM files work as well as PEM bytes.
    for name, data in (('ca.pem', pki.ca_pem), ('client.pem', pki.client_pem),
                       ('client.key', pki.client_key)):
        (tmp_path / name).write_bytes(data)
    with_certificate = courier.Client(server.address, call_timeout=10, tls=courier.TLSConfig(
        root_certificates=str(tmp_path / 'ca.pem'),
        certificate_chain=tmp_path / 'client.pem', private_key=str(tmp_path / 'client.key')))
    assert with_certificate.add(1, 1) == 2
    assert with_certificate.protocol == lane


def test_tls_with_auth_token(make_server, pki):
    server = serve_add(make_server, auth_token='both', tls=courier.TLSConfig(
        certificate_chain=pki.server_pem, private_key=pki.server_key))
    tls = courier.TLSConfig(root_certificates=pki.ca_pem.decode(), server_name='localhost')
    assert courier.Client(server.address, auth_token='both', tls=tls).add(2, 5) == 7
    with pytest.raises(courier.PermissionDeniedError):
        courier.Client(server.address, tls=tls).add(2, 5)


def test_tls_config_validation_and_repr(pki):
    with pytest.raises(ValueError, match='both certificate_chain and private_key'):
        courier.TLSConfig(certificate_chain=pki.server_pem)
    with pytest.raises(TypeError, match='PEM bytes'):
        courier.TLSConfig(root_certificates=123)
    with pytest.raises(ValueError, match='a TLS server needs'):
        courier.Server(tls=courier.TLSConfig(root_certificates=pki.ca_pem))
    config = courier.TLSConfig(certificate_chain=pki.server_pem, private_key=pki.server_key)
    assert 'PRIVATE' not in repr(config) and 'private_key=<' in repr(config)
