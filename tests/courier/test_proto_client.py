"""Any gRPC client can call a courier node: one generated from protos/courier.proto, without courier.

A courier server on TCP serves courier's framed protocol and gRPC on one port. This test
generates a Python client from the proto with grpc_tools into a temporary directory and
runs it in a process that cannot import courier, so nothing but the proto, pickle and
grpcio carries the calls, as a client in another language would.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import courier

_CLIENT = r'''
import pickle
import sys

sys.modules['courier'] = None  # Importing courier fails here: only the generated code is used.
import grpc
import numpy
import courier_pb2
import courier_pb2_grpc

address, token = sys.argv[1], sys.argv[2]
metadata = (('authorization', 'Bearer ' + token),)
with grpc.insecure_channel(address) as channel:
    stub = courier_pb2_grpc.CourierStub(channel)
    listed = stub.ListMethods(courier_pb2.ListMethodsRequest(), timeout=30, metadata=metadata)
    print('METHODS', ','.join(listed.methods))
    reply = stub.Call(courier_pb2.CallRequest(
        method='add', pickle=pickle.dumps(((40, 2), {}), protocol=5)), timeout=30,
        metadata=metadata)
    assert reply.status == courier_pb2.CallResponse.OK, reply
    print('RESULT', pickle.loads(reply.pickle))
    reply = stub.Call(courier_pb2.CallRequest(
        method='fail', pickle=pickle.dumps(((), {}), protocol=5)), timeout=30, metadata=metadata)
    assert reply.status == courier_pb2.CallResponse.EXCEPTION, reply
    print('EXCEPTION', reply.exception_type, reply.message)
    try:
        stub.ListMethods(courier_pb2.ListMethodsRequest(), timeout=30)
    except grpc.RpcError as error:
        print('WITHOUT TOKEN', error.code().name)

    # A large argument streams as the proto says: a first Chunk whose data is the encoded
    # CallRequest announcing the out-of-band buffers' sizes, then Chunks of their bytes.
    buffers = []
    array = numpy.arange(2 << 20, dtype=numpy.int32)  # 8 MiB, pickled out-of-band.
    argument = pickle.dumps(((array,), {}), protocol=5, buffer_callback=buffers.append)
    data = [bytes(buffer.raw()) for buffer in buffers]
    header = courier_pb2.CallRequest(method='reverse', pickle=argument,
                                     buffer_sizes=[len(part) for part in data])
    chunks = [courier_pb2.Chunk(data=header.SerializeToString())] + [
        courier_pb2.Chunk(data=part[start:start + (1 << 20)])
        for part in data for start in range(0, len(part), 1 << 20)]
    reply = stub.CallStream(iter(chunks), timeout=60, metadata=metadata)
    assert reply.status == courier_pb2.CallResponse.OK, reply
    # Its large result is announced by result_id and buffer_sizes, then fetched in Chunks.
    assert reply.result_id and list(reply.buffer_sizes) == [8 << 20], reply
    fetched = b''.join(chunk.data for chunk in stub.Fetch(
        courier_pb2.FetchRequest(result_id=reply.result_id), timeout=60, metadata=metadata))
    result = pickle.loads(reply.pickle, buffers=[fetched])
    print('LARGE', len(data[0]), (result == array[::-1] + 1).all())
'''


@pytest.fixture(scope='module')
def generated(tmp_path_factory):
    """A directory holding courier_pb2.py and courier_pb2_grpc.py made from the proto now."""
    directory = tmp_path_factory.mktemp('generated')
    protos = os.path.join(os.path.dirname(__file__), '..', '..', 'protos')
    result = subprocess.run(
        [sys.executable, '-m', 'grpc_tools.protoc', f'-I{protos}', f'--python_out={directory}',
         f'--grpc_python_out={directory}', os.path.join(protos, 'courier.proto')],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    (directory / 'client.py').write_text(_CLIENT)
    return directory


def _fail():
    raise KeyError('on purpose')


def test_a_client_generated_from_the_proto_calls_a_node(make_server, generated):
    server = make_server(auth_token='s3cret')
    server.Bind('add', lambda x, y: x + y)
    server.Bind('fail', _fail)
    server.Bind('reverse', lambda array: array[::-1] + 1)  # A new array: out-of-band.
    server.Start()
    env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    result = subprocess.run([sys.executable, 'client.py', server.address, 's3cret'],
                            cwd=generated, capture_output=True, text=True, timeout=120,
                            check=False, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == 'METHODS add,fail,reverse'
    assert lines[1] == 'RESULT 42'
    assert lines[2].startswith('EXCEPTION KeyError') and 'on purpose' in lines[2]
    assert lines[3] == 'WITHOUT TOKEN UNAUTHENTICATED'
    assert lines[4] == f'LARGE {8 << 20} True'
    # The same port still serves courier's own clients over the framed protocol.
    client = courier.Client(server.address, auth_token='s3cret', call_timeout=30)
    assert client.add(1, 2) == 3 and client.protocol == 'framed'
