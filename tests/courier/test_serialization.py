"""What travels by value keeps where it came from: a failing function's traceback names its file
and shows its line wherever it runs (cloudpickle 3.1 renames every file to '<dynamic-code>')."""
import pickle
import traceback

from courier import serialization

SOURCE = '''
def fails(x):
    y = x + 1
    raise ValueError(f'failed at {y}')
'''


def test_a_function_sent_by_value_keeps_its_file_and_line(tmp_path):
    path = tmp_path / 'script.py'
    path.write_text(SOURCE)
    namespace = {'__name__': 'not_importable'}  # so that it travels by value, as __main__ does
    exec(compile(SOURCE, str(path), 'exec'), namespace)  # pylint: disable=exec-used
    data, buffers = serialization.dumps(namespace['fails'], 'the function')
    copy = serialization.loads(data, buffers, 'the function')
    assert copy.__code__.co_filename == str(path)
    try:
        copy(1)
    except ValueError as error:
        frame = traceback.extract_tb(error.__traceback__)[-1]
    assert (frame.filename, frame.lineno, frame.line) == (
        str(path), 4, "raise ValueError(f'failed at {y}')")


def test_cloudpickle_dumps_keeps_nested_code_and_round_trips(tmp_path):
    path = tmp_path / 'nested.py'
    source = 'def outer():\n    def inner():\n        return 7\n    return inner\n'
    namespace = {'__name__': 'not_importable'}
    exec(compile(source, str(path), 'exec'), namespace)  # pylint: disable=exec-used
    inner = pickle.loads(serialization.cloudpickle_dumps(namespace['outer']))()
    assert inner() == 7 and inner.__code__.co_filename == str(path)


def test_no_arguments_and_a_none_result_skip_pickling_and_read_as_fresh_values():
    """A call without arguments and a result of None travel as pickles made once: they are
    what pickle makes of them, and each read gives a new kwargs dict (a method changing its
    own cannot reach another call's); a compressed call still compresses them."""
    data, buffers = serialization.dumps_arguments((), {}, 'noop')
    assert data == pickle.dumps(((), {}), protocol=serialization.PROTOCOL) and buffers == []
    assert serialization.dumps(None, 'x') == (pickle.dumps(None, protocol=5), [])
    first = serialization.loads(bytearray(data), [], 'x')
    first[1]['changed'] = True
    assert first == ((), {'changed': True}) and serialization.loads(data, [], 'x') == ((), {})
    assert serialization.loads(memoryview(pickle.dumps(None, protocol=5)), [], 'x') is None
    compressed, _ = serialization.dumps_arguments((), {}, 'noop', compress=True)
    assert serialization.is_compressed(compressed)
    assert serialization.loads(compressed, [], 'x') == ((), {})
    assert serialization.dumps_arguments((1,), {}, 'add')[0] == pickle.dumps(((1,), {}), 5)
