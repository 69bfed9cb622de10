"""The launching script's absl flags, shipped to node processes so that node code reads them.

absl refuses to pickle `Flag` objects, so their state travels instead (`snapshot`), and a worker
rebuilds them before the node runs (`install`). `FLAGS` itself pickles by reference: a node that
holds it reads the `FLAGS` of its own process.
"""
from __future__ import annotations

import copyreg
import logging
import pickle
from typing import Any, Dict, List, Mapping, Sequence, Union

FlagArgs = Union[Mapping[str, object], Sequence[str], None]


def overrides(args: FlagArgs) -> List[str]:
    """Flag values given as {name: value} or ['--name=value'], as '--name=value' strings."""
    if not args:
        return []
    if isinstance(args, Mapping):
        return [f'--{name}={value}' for name, value in args.items()]
    return list(args)


def snapshot() -> Dict[str, Any]:
    """The launching process's parsed flags (name -> (class, state, defining module)), to
    rebuild in a worker.

    Validators stay behind: values were validated here.
    """
    from absl import flags  # pylint: disable=import-outside-toplevel
    if not flags.FLAGS.is_parsed():
        return {}
    import cloudpickle  # pylint: disable=import-outside-toplevel
    pickle_by_reference()
    shipped = {}
    for name in flags.FLAGS:
        flag = flags.FLAGS[name]
        if flag.name != name:  # a short name
            continue
        state = (type(flag), {k: v for k, v in vars(flag).items() if k != 'validators'})
        try:
            cloudpickle.dumps(state)
        except Exception:  # pylint: disable=broad-except
            if flag.present:
                logging.warning('Flag --%s cannot be sent to node processes; they see its default.',
                                name)
            continue
        shipped[name] = state + (flags.FLAGS.find_module_defining_flag(name),)
    return shipped


def install(shipped: Mapping[str, Any], flag_overrides: Sequence[str]) -> None:
    """Rebuilds the shipped flags in this process, applies `flag_overrides` and marks them parsed.

    A rebuilt flag is registered under the module that defined it in the launching process, so
    that node code importing that module later finds its flag defined (absl then keeps the
    shipped flag and its value) instead of failing with a duplicate definition.
    """
    from absl import flags  # pylint: disable=import-outside-toplevel
    for name, (flag_class, state, module_name) in shipped.items():
        if name in flags.FLAGS:
            if state['present']:
                flags.FLAGS[name].value = state['_value']
                flags.FLAGS[name].present = state['present']
        else:
            flag = flag_class.__new__(flag_class)
            flag.__dict__.update(state, validators=[])
            flags.FLAGS[name] = flag
            if module_name is not None:
                flags.FLAGS.register_flag_by_module(module_name, flag)
    if flag_overrides:
        flags.FLAGS(['worker'] + list(flag_overrides), known_only=True)
    flags.FLAGS.mark_as_parsed()


def pickle_by_reference() -> None:
    """Makes `absl.flags.FLAGS` pickle as a reference to the FLAGS of the unpickling process."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    copyreg.pickle(flags.FlagValues, _reduce_flag_values)


def _global_flags():
    from absl import flags  # pylint: disable=import-outside-toplevel
    return flags.FLAGS


def _reduce_flag_values(flag_values):
    from absl import flags  # pylint: disable=import-outside-toplevel
    if flag_values is not flags.FLAGS:
        raise pickle.PicklingError('Only absl.flags.FLAGS can be sent to a node process.')
    return _global_flags, ()
