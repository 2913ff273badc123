"""The keys a configuration may hold, and the types of the arguments it hands on.

`zoo.runs.settings.RunSettings.from_config` calls these before it reads any value, so that a
misspelt or mistyped setting is refused before a run creates anything, instead of being
saved into `config.json` and ignored (`--set training.epoch=1` once trained the default
number of epochs):

- `refuse_unknown(section, keys, known)`: a key no part knows is a `ConfigError` naming the
  nearest valid key (`difflib.get_close_matches`): "unknown setting training.epoch; did you
  mean training.epochs?".
- `argument_kinds(module, name)`: what each named parameter of a function, or of a class's
  constructor (with those of its tflm / zoo bases), takes, read from the type of its
  default: an int default takes an integer (never 2.5, never "big", never true), a float
  default a finite number, a bool default true or false. Parameters without a default, or
  whose default is None or a string, take what the callee checks itself (a head's spec,
  "auto"). The signatures are read from the source files (`ast`), not imported: checking a
  configuration imports no Keras and no TensorFlow (a PyTorch-only worker of
  tools/compare_frameworks.py reads settings too). `check_arguments` applies them.
- `model_arguments(kind)`: those of the model family `model.kind` names (its class and its
  bases: `zoo.models.registry.MODEL_KINDS`), so a new family is checked with no table to
  keep.
- `SYNTHETIC_LANGUAGES` / `synthetic_maker(kind)`: the function that makes each synthetic
  corpus kind; its parameters are the `corpus` keys that kind takes
  (`language_arguments(kind)`).
"""

import ast
import difflib
import functools
import importlib
import importlib.util
import math
import pathlib

from zoo.errors import ConfigError
from zoo.models.registry import MODEL_KINDS

# The parts of a configuration beside corpus / model / training: what presets carry for
# people and for other commands, and what the commands add (preset, finetune, search).
TOP_LEVEL = ("preset", "description", "reproduces", "reference", "published", "deviations",
             "base", "dynamic_evaluation", "cache_pointer", "finetune", "search")

# corpus.kind -> (module, function) making that synthetic language: its keyword arguments
# are the corpus part's language parameters. Named as strings: reading them imports nothing.
SYNTHETIC_LANGUAGES = {"markov": ("tflm.data.synthetic", "markov_language"),
                       "mixture": ("tflm.data.synthetic", "mixture_markov_language"),
                       "zipf": ("tflm.data.zipf", "zipf_language")}

# Parameters whose default does not say their type.
_VOCAB_SIZE = {"vocab_size": "integer"}

_WHAT = {"integer": "an integer", "number": "a finite number", "boolean": "true or false"}


def is_integer(value):
    """An int, not a bool (JSON's true is not 1 here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    """A finite int or float, not a bool."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


_TESTS = {"integer": is_integer, "number": is_number, "boolean": lambda v: isinstance(v, bool)}


def refuse_unknown(section, keys, known, where=""):
    """Raise `ConfigError` for the first of `keys` not in `known`, with the nearest known
    key when one is close, else the list of known keys. `section`: the part's dotted name
    ("training", "corpus", "" for the top level); `where`: what the part is, when that
    decides its keys (", for corpus ptb")."""
    known = sorted(known)
    for key in keys:
        if key in known:
            continue
        name = f"{section}.{key}" if section else key
        close = difflib.get_close_matches(str(key), known, n=1)
        if close:
            hint = f"did you mean {section + '.' if section else ''}{close[0]}?"
        else:
            hint = f"the {section or 'top level'} part takes {', '.join(known)}."
        raise ConfigError(f"unknown setting {name}{where}; {hint}")


def _kind_of(default):
    return ("boolean" if isinstance(default, bool) else "integer" if isinstance(default, int)
            else "number" if isinstance(default, float) else None)


def _source_file(module):
    """The .py file of `module` (dotted), found without importing it or its packages
    (importing `tflm` starts TensorFlow): the top-level package's folder + the path."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"cannot find the source of {module} (package {top} not found).")
    folder = pathlib.Path(list(spec.submodule_search_locations)[0])
    path = folder.joinpath(*rest).with_suffix(".py")
    return path if path.is_file() else folder.joinpath(*rest, "__init__.py")


@functools.lru_cache(maxsize=None)
def _parsed(module):
    return ast.parse(_source_file(module).read_text(encoding="utf-8"))


def _constant(tree, node):
    """The literal value of a default (a module-level constant's, for a name); raises
    ValueError when it is not a literal."""
    if isinstance(node, ast.Name):
        for statement in tree.body:
            if isinstance(statement, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == node.id for t in statement.targets):
                return ast.literal_eval(statement.value)
    return ast.literal_eval(node)


def _parameters(module, name):
    """[(parameter, default kind)] of function `name`, or of class `name`'s `__init__` then
    its bases' (those imported from tflm or zoo), as `module`'s source defines them."""
    tree = _parsed(module)
    node = next((n for n in tree.body if getattr(n, "name", None) == name), None)
    if node is None:
        raise ConfigError(f"{module} defines no {name}.")
    found, bases = [], []
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef)
                     and n.name == "__init__"), None)
        imported = {alias.asname or alias.name: statement.module
                    for statement in tree.body if isinstance(statement, ast.ImportFrom)
                    for alias in statement.names}
        bases = [(imported[b.id], b.id) for b in node.bases if isinstance(b, ast.Name)
                 and imported.get(b.id, "").split(".")[0] in ("tflm", "zoo")]
        bases += [(module, b.id) for b in node.bases if isinstance(b, ast.Name)
                  and b.id not in imported]
        node = init
    if node is not None:
        args = node.args.posonlyargs + node.args.args
        defaults = [None] * (len(args) - len(node.args.defaults)) + node.args.defaults
        pairs = list(zip(args, defaults)) + list(zip(node.args.kwonlyargs,
                                                     node.args.kw_defaults))
        for arg, default in pairs:
            try:
                kind = None if default is None else _kind_of(_constant(tree, default))
            except ValueError:
                kind = None  # not a literal: the callee checks it
            found.append((arg.arg, kind))
    for base_module, base in bases:
        found += _parameters(base_module, base)
    return [(n, k) for n, k in found if n != "self"]


def argument_kinds(module, name, explicit=None):
    """{parameter: "integer" | "number" | "boolean" | None} of function or class `name` in
    `module` (a class: its constructor's, then its tflm / zoo bases'; the first to name a
    parameter decides), from the types of the defaults; `explicit` overrides."""
    kinds = {}
    for parameter, kind in _parameters(module, name):
        kinds.setdefault(parameter, kind)
    kinds.update(explicit or {})
    return kinds


def check_arguments(section, values, kinds):
    """Raise `ConfigError` naming the first of `values` whose value is not of its kind."""
    for key, value in values.items():
        kind = kinds.get(key)
        if kind is not None and not _TESTS[kind](value):
            raise ConfigError(f"{section}.{key} must be {_WHAT[kind]}; got {value!r}.")


def model_arguments(kind):
    """`argument_kinds` of the model family `kind`: its class's constructor and those of its
    bases in tflm and zoo (`tflm.LanguageModel`: bptt, clip_norm, ...), not Keras'."""
    if kind not in MODEL_KINDS:
        raise ConfigError(f"unknown model.kind {kind!r}; use one of "
                          f"{', '.join(sorted(MODEL_KINDS))}.")
    return argument_kinds(*MODEL_KINDS[kind], explicit=_VOCAB_SIZE)


def synthetic_maker(kind):
    """The function making the synthetic corpus `kind` ("markov", "mixture", "zipf")."""
    if kind not in SYNTHETIC_LANGUAGES:
        raise ConfigError(f"unknown synthetic corpus kind {kind!r} (corpus.kind); use "
                          f"{', '.join(SYNTHETIC_LANGUAGES)}.")
    module, name = SYNTHETIC_LANGUAGES[kind]
    return getattr(importlib.import_module(module), name)


def language_arguments(kind):
    """`argument_kinds` of the synthetic corpus `kind`'s maker (vocab_size an integer)."""
    if kind not in SYNTHETIC_LANGUAGES:
        synthetic_maker(kind)  # the error naming the kinds
    return argument_kinds(*SYNTHETIC_LANGUAGES[kind], explicit=_VOCAB_SIZE)
