"""zoo's classes known to Keras serialization from the moment Keras is imported, so that
`keras.saving.load_model("run/best.keras")` rebuilds a zoo model after `import zoo`, as it
does a KerasHub model after `import keras_hub`.

`import zoo` stays cheap and imports no Keras: the main job sets Keras' backend and the
XLA / allocator variables before Keras starts (`zoo.runtime`), so zoo cannot import Keras
itself, and importing the model families while Keras loads could meet a tflm or zoo module
half imported. So:

- Keras imported already: stand-ins are registered now.
- Not yet: a finder on `sys.meta_path` waits for `import keras`, lets the real finders
  locate it, and wraps that loader so that the stand-ins are registered right after Keras'
  own `__init__` has run. The finder removes itself at that first import.

A stand-in is registered under each name of `registry.SERIALIZABLE` ("zoo>AWDLSTM", ...)
through Keras' public live dictionary (`keras.saving.get_custom_objects`). Keras calls its
`from_config` when a saved model names it; the stand-in then imports the model families
(their decorators register tflm's layers with them), puts every real class in place of its
stand-in and hands the config to the real one. A family imported directly replaces its
stand-ins through its own decorators.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from zoo.models.registry import SERIALIZABLE


def register_when_keras_loads():
    """Register the stand-ins now if Keras is loaded, else at Keras' first import."""
    if "keras" in sys.modules:
        register_stand_ins()
    elif not any(isinstance(f, _KerasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _KerasFinder())


def register_stand_ins():
    """Register a stand-in under every zoo name Keras has no class for yet."""
    import keras  # deferred: called once Keras is loaded; `import zoo` imports none

    registered = keras.saving.get_custom_objects()
    for name in SERIALIZABLE:
        registered.setdefault(f"zoo>{name}", _stand_in(name))


def _stand_in(name):
    def from_config(cls, config):
        import keras  # deferred: as above

        registered = keras.saving.get_custom_objects()
        for other, module in SERIALIZABLE.items():  # the real classes, tflm's layers with them
            registered[f"zoo>{other}"] = getattr(importlib.import_module(module), other)
        return registered[f"zoo>{name}"].from_config(config)

    return type(name, (), {"zoo_stand_in": True, "__module__": SERIALIZABLE[name],
                           "__doc__": f"Imports {SERIALIZABLE[name]} when Keras rebuilds "
                                      f"a saved {name}.",
                           "get_config": lambda self: {},
                           "from_config": classmethod(from_config)})


class _KerasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        sys.meta_path.remove(self)  # once; the next line asks the real finders
        spec = importlib.util.find_spec("keras")
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterAfter(spec.loader)
        return spec


class _RegisterAfter(importlib.abc.Loader):
    """Keras' own loader, then the stand-ins."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self._loader  # Keras sees its own
        self._loader.exec_module(module)
        register_stand_ins()

    def __getattr__(self, name):  # resources, get_code, ...: Keras' loader answers
        return getattr(self._loader, name)
