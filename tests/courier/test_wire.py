"""courier.wire matches protobuf's encoding of protos/courier.proto and rejects garbage."""

from __future__ import annotations

import random

import pytest

from courier import courier_pb2
from courier.transport import grpc as grpc_transport
from courier import wire


def _random_bytes(rng: random.Random, max_size: int = 300) -> bytes:
    return rng.randbytes(rng.choice([0, 1, 5, 127, 128, 300, rng.randrange(max_size)]))


def _random_text(rng: random.Random) -> str:
    return ''.join(rng.choice('abc_é漢\x00') for _ in range(rng.randrange(20)))


@pytest.mark.parametrize('seed', range(50))
def test_request_matches_protobuf(seed):
    rng = random.Random(seed)
    method, pickle = _random_text(rng), _random_bytes(rng)
    buffers = [_random_bytes(rng) for _ in range(rng.randrange(4))]
    sizes = [rng.choice([0, 1, 127, 128, 2**40]) for _ in range(rng.randrange(3))]
    ours = wire.encode_request(method, pickle, [memoryview(b) for b in buffers], sizes)
    reference = courier_pb2.CallRequest(method=method, pickle=pickle, buffers=buffers,
                                        buffer_sizes=sizes)
    assert ours == reference.SerializeToString()
    decoded = wire.decode_request(ours)
    assert (decoded.method, bytes(decoded.pickle)) == (method, pickle)
    assert [bytes(b) for b in decoded.buffers] == buffers
    assert decoded.buffer_sizes == sizes


@pytest.mark.parametrize('seed', range(50))
def test_response_matches_protobuf(seed):
    rng = random.Random(seed)
    fields = dict(status=rng.randrange(4), pickle=_random_bytes(rng),
                  buffers=[_random_bytes(rng) for _ in range(rng.randrange(3))],
                  message=_random_text(rng), exception_type=_random_text(rng),
                  traceback=_random_text(rng),
                  methods=[_random_text(rng) for _ in range(rng.randrange(3))],
                  buffer_sizes=[rng.randrange(2**33) for _ in range(rng.randrange(3))],
                  result_id=rng.choice([0, 1, 2**63 - 1]))
    ours = wire.encode_response(wire.Response(**fields))
    reference = courier_pb2.CallResponse(**fields)
    assert ours == reference.SerializeToString()
    decoded = wire.decode_response(ours)
    for name, value in fields.items():
        got = getattr(decoded, name)
        if name == 'pickle':
            got = bytes(got)
        elif name == 'buffers':
            got = [bytes(b) for b in got]
        assert got == value, name


def test_method_list_matches_protobuf():
    methods = ['add', '', '__call__']
    ours = wire.encode_method_list(methods)
    assert ours == courier_pb2.ListMethodsResponse(methods=methods).SerializeToString()
    assert wire.decode_method_list(ours) == methods


def test_chunk_and_fetch_request_match_protobuf():
    for data in (b'', b'x', bytes(range(256)) * 100):
        ours = wire.encode_chunk(memoryview(data))
        assert ours == courier_pb2.Chunk(data=data).SerializeToString()
        assert bytes(wire.decode_chunk(ours)) == data
    for result_id in (0, 1, 2**63 - 1):
        ours = wire.encode_fetch_request(result_id)
        assert ours == courier_pb2.FetchRequest(result_id=result_id).SerializeToString()
        assert wire.decode_fetch_request(ours) == result_id


def test_unpacked_repeated_sizes_are_accepted():
    unpacked = b'\x20\x05\x20\x81\x01'  # buffer_sizes 5 and 129 as separate varint fields.
    assert wire.decode_request(unpacked).buffer_sizes == [5, 129]


def test_decoding_skips_unknown_fields():
    reference = courier_pb2.CallRequest(method='m', pickle=b'p').SerializeToString()
    unknown = b'\x78\x05' + b'\x81\x01' + b'12345678' + b'\x85\x01' + b'1234'  # Fields 15, 16, 16.
    decoded = wire.decode_request(unknown + reference)
    assert (decoded.method, bytes(decoded.pickle), decoded.buffers) == ('m', b'p', [])


def test_decoded_fields_are_views_not_copies():
    big = bytes(1 << 20)
    decoded = wire.decode_request(wire.encode_request('m', b'', [memoryview(big)]))
    assert isinstance(decoded.buffers[0], memoryview) and decoded.buffers[0].nbytes == len(big)


@pytest.mark.parametrize('garbage', [
    b'\x0a\x05ab',                    # Length beyond the end.
    b'\x0a',                          # Ends inside a varint.
    b'\x0a' + b'\xff' * 11,           # Varint too long.
    b'\x00\x01',                      # Field number 0.
    b'\x0b',                          # Wire type 3 (groups) is not supported.
    b'\x08\x01',                      # Method as a varint.
    b'\x0a\x02\xff\xfe',              # Method not UTF-8.
    b'\x79\x01',                      # Fixed64 field cut short.
    b'\x22\x02\x80\x80',              # Packed sizes ending inside a varint.
    b'\x22\x01',                      # Packed sizes beyond the end.
])
def test_malformed_requests_raise_value_error(garbage):
    with pytest.raises(ValueError):
        wire.decode_request(garbage)


def test_random_garbage_only_ever_raises_value_error():
    rng = random.Random(0)
    valid = wire.encode_request('method', b'pickle-bytes', [memoryview(b'x' * 40)])
    for _ in range(3000):
        if rng.random() < 0.5:
            data = rng.randbytes(rng.randrange(64))
        else:  # Corrupt a valid message: more realistic garbage.
            data = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data[:rng.randrange(len(data) + 1)])
        for decode in (wire.decode_request, wire.decode_response, wire.decode_method_list,
                       wire.decode_chunk, wire.decode_fetch_request):
            try:
                decode(data)
            except ValueError:
                pass


def test_service_names_match_the_proto():
    service = courier_pb2.DESCRIPTOR.services_by_name['Courier']
    assert service.full_name == grpc_transport.SERVICE
    assert {f'/{service.full_name}/{m.name}' for m in service.methods} == {
        grpc_transport.CALL, grpc_transport.CALL_STREAM, grpc_transport.FETCH,
        grpc_transport.LIST_METHODS}
    status = courier_pb2.CallResponse.Status
    assert (status.OK, status.EXCEPTION, status.UNKNOWN_METHOD, status.SERIALIZATION_ERROR) == (
        wire.OK, wire.EXCEPTION, wire.UNKNOWN_METHOD, wire.SERIALIZATION_ERROR)


@pytest.mark.parametrize('seed', range(20))
def test_a_call_streams_first_message_is_a_chunk_wrapping_the_request_or_the_request(seed):
    """What protos/courier.proto describes (a Chunk whose data is the CallRequest), which typed
    clients send, and the CallRequest itself, which courier's own clients send, decode alike."""
    rng = random.Random(seed)
    request = courier_pb2.CallRequest(
        method=_random_text(rng), pickle=_random_bytes(rng) or b'\x80',
        buffer_sizes=[rng.choice([1, 127, 128, 2**40]) for _ in range(rng.randrange(1, 4))])
    for first in (courier_pb2.Chunk(data=request.SerializeToString()).SerializeToString(),
                  request.SerializeToString()):
        decoded = wire.decode_call_stream_start(first)
        assert (decoded.method, bytes(decoded.pickle), decoded.buffer_sizes, decoded.buffers) == (
            request.method, request.pickle, list(request.buffer_sizes), [])
