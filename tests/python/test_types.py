"""Arguments of the wrong type: a TypeError naming the argument, the type it takes and the one it
got, from every entry point; never pybind11's listing of the C++ overloads."""

import numpy as np
import pytest

import distmuon
from distmuon import _core

W = np.zeros((4, 3), np.float32)


def _core_muon():
    return distmuon.Muon(distmuon.communicator())


CASES = [
    # (call, words the message must hold)
    (lambda: distmuon.newton_schulz(W, steps="5"), ["'steps'", "int", "str"]),
    (lambda: distmuon.newton_schulz(W, syrk="yes"), ["'syrk'", "bool", "str"]),
    (lambda: distmuon.newton_schulz(W, algorithm=3), ["'algorithm'", "str", "int"]),
    (lambda: distmuon.newton_schulz(W, coefficients=5), ["coefficients", "int"]),
    (lambda: _core_muon().add_parameter(W, 5), ["'name'", "str", "int"]),
    (lambda: _core_muon().add_parameter(W, "w", rows="4"), ["'rows'", "int", "str"]),
    (lambda: _core_muon().add_parameter(W, "w", tp_dim="0"), ["'tp_dim'", "str"]),
    (lambda: _core_muon().set_learning_rates("a", 1.0), ["argument 1", "float", "str"]),
    (lambda: _core_muon().set_weight_decays(0.1, [1]), ["argument 2", "float", "list"]),
    (lambda: distmuon.plan([(64, 64)], group_size="8"), ["'group_size'", "int", "str"]),
    (lambda: distmuon.plan(5), ["shapes", "int"]),
    (lambda: distmuon.process_groups(None, "2", 1), ["int", "str"]),
    (lambda: _core_muon().save(5), ["int"]),
    # The right type past the C++ argument's range: the argument and its value, no signature.
    (lambda: distmuon.newton_schulz(W, steps=2**40), ["'steps'", "1099511627776", "range"]),
    (lambda: distmuon.plan([(64, 64)], steps=2**40), ["'steps'", "1099511627776", "range"]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_wrong_types_are_named(case):
    call, words = CASES[case]
    with pytest.raises(TypeError) as info:
        call()
    message = str(info.value)
    print(message)
    assert "incompatible function arguments" not in message
    assert "following argument types" not in message
    assert "do not match" not in message
    for w in words:
        assert w in message, (w, message)


def test_step_refuses_a_non_list_on_every_rank():
    with pytest.raises(distmuon.CollectiveError, match="grads takes a list of arrays, got int"):
        _core_muon().step(5)


def test_every_binding_is_translated():
    """The class fix: every function of the extension and every method of its classes goes
    through the translator (a binding added later is covered without a new test)."""
    missing = []
    for name, obj in vars(_core).items():
        if type(obj).__name__ == "builtin_function_or_method":
            missing.append(name)
        elif isinstance(obj, type):
            missing += [f"{name}.{m}" for m, v in vars(obj).items()
                        if type(v).__name__ == "instancemethod" and not m.startswith("__")]
    assert not missing, missing
    assert hasattr(_core.newton_schulz, "__wrapped__")


@pytest.mark.parametrize("state, words", [
    ({}, "no 'params'"),
    ({"params": []}, "no 'step'"),
    ({"params": 3, "step": 0}, "'params' must be a list"),
    ({"params": [{"state": []}], "step": 0}, "parameter 0 of the state has no 'name'"),
    ([], "expected the dict of a state_dict()"),
])
def test_a_malformed_state_dict_is_named(state, words):
    """No KeyError: 'params' from deep inside: what the state lacks, as distmuon.Error."""
    opt = _core_muon()
    opt.add_parameter(np.zeros((4, 4), np.float32), "w")
    with pytest.raises(distmuon.Error) as info:
        opt.load_state_dict(state)
    assert words in str(info.value), str(info.value)


def test_errors_are_distmuon_errors_by_name():
    """A traceback says "distmuon.Error: ...", not the extension's "distmuon._core.Error"."""
    import traceback
    assert distmuon.Error.__module__ == "distmuon"
    assert distmuon.CollectiveError.__module__ == "distmuon"
    with pytest.raises(distmuon.Error) as info:
        distmuon.newton_schulz(W, steps=-1)
    line = traceback.format_exception_only(info.type, info.value)[-1]
    assert line.startswith("distmuon.Error: "), line
