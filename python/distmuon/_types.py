"""Argument type errors in the user's words: pybind11 answers a call with arguments of the wrong
type by a TypeError listing every C++ overload ("incompatible function arguments. The following
argument types are supported: ..."). wrap_module() puts every function and method of the
extension module behind one translator that names the argument, the type it takes and the type
it got, so that no message shows the binding's internals.
"""

import functools
import re

_PYBIND = "incompatible function arguments"

# pybind11's annotations, in plain words (the first pattern that matches wins).
_PLAIN = [
    (re.compile(r"Sequence\[.*Sequence"), "a list of lists"),
    (re.compile(r"Sequence|list\["), "a list"),
    (re.compile(r"Mapping|dict\["), "a dict"),
    (re.compile(r"numpy\.ndarray"), "a NumPy array"),
    (re.compile(r"SupportsFloat"), "float"),
    (re.compile(r"SupportsInt|SupportsIndex"), "int"),
    (re.compile(r"^bool$"), "bool"),
    (re.compile(r"^str$|os\.PathLike"), "str"),
]
_ACCEPTS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,),
            "a list": (list, tuple), "a list of lists": (list, tuple), "a dict": (dict,)}


def _split_top(text):
    """text split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _parameters(message):
    """[(name, plain type)] of the first overload listed in pybind11's message."""
    m = re.search(r"1\. \((.*)\) ->", message)
    if not m:
        return []
    out = []
    for p in _split_top(m.group(1)):
        name, _, annotation = p.partition(":")
        annotation = annotation.split(" = ")[0].strip()
        plain = next((word for rx, word in _PLAIN if rx.search(annotation)),
                     annotation.rsplit(".", 1)[-1])
        out.append((name.strip(), plain))
    return out


def _describe(name, args, kwargs, message, method):
    params = _parameters(message)
    if method and params and params[0][0] == "self":
        params = params[1:]
    given = list(zip(params, args)) + [((k, t), kwargs[k]) for k, t in params if k in kwargs]
    for (pname, plain), value in given:
        accepts = _ACCEPTS.get(plain)
        if accepts is not None and (not isinstance(value, accepts) or
                                    (plain != "bool" and isinstance(value, bool))):
            which = f"'{pname}'" if not re.fullmatch(r"arg\d+", pname) else \
                f"{int(pname[3:]) + 1}"
            return (f"{name}(): argument {which} takes {plain}, got "
                    f"{type(value).__name__} {value!r:.60}")
    # The right types, but an integer past the C++ argument's range (steps=2**40, rows=-1 for a
    # size): named with its value rather than the whole signature.
    for (pname, plain), value in given:
        if plain == "int" and isinstance(value, int) and not isinstance(value, bool) and \
                not -2**31 <= value < 2**31:
            return f"{name}(): argument '{pname}' = {value} is out of its range"
    for (pname, plain), value in given:
        if plain == "int" and isinstance(value, int) and not isinstance(value, bool) and value < 0:
            return f"{name}(): argument '{pname}' = {value} is out of its range (negative)"
    takes = ", ".join(f"{p}: {t}" for p, t in params)
    got = ", ".join([type(a).__name__ for a in args] +
                    [f"{k}={type(v).__name__}" for k, v in kwargs.items()])
    return f"{name}(): arguments ({got}) do not match ({takes})"


def _translated(fn, name, method):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if _PYBIND not in str(e):
                raise
            shown = args[1:] if method else args
            raise TypeError(_describe(name, shown, kwargs, str(e), method)) from None
    return call


def wrap_module(module):
    """Every pybind11 function of module, and every method of its classes, behind the
    translator (in place; idempotent)."""
    if getattr(module, "_types_wrapped", False):
        return
    for attr, obj in list(vars(module).items()):
        if type(obj).__name__ == "builtin_function_or_method":
            setattr(module, attr, _translated(obj, attr, method=False))
        elif isinstance(obj, type):
            for mname, m in list(vars(obj).items()):
                if type(m).__name__ == "instancemethod" and not mname.startswith("__"):
                    setattr(obj, mname, _translated(m, mname, method=True))
    module._types_wrapped = True


def describe_exception(e):
    """An exception as a reason in the user's words: its message without its class's name ("grads
    takes a list", not "TypeError: grads takes a list"); a KeyError as the key that is missing;
    an exception without a message by what it means."""
    if isinstance(e, KeyError) and e.args:
        return f"the key {e.args[0]!r} is missing"
    if isinstance(e, MemoryError):
        return f"out of memory{': ' + str(e) if str(e) else ''}"
    text = str(e)
    return text if text else f"{type(e).__name__} (without a message)"
