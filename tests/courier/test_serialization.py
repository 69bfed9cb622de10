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
