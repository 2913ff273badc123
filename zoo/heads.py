"""Output heads by name, for presets and `python -m zoo.train --head NAME`."""

import keras

from tflm import layers

# name -> (class name in tflm.layers, whether it takes every layer's output)
_HEADS = {
    "softmax": "SoftmaxLayer",
}


def head_names():
    """Names accepted by `make_head` (only those whose layer is available)."""
    return sorted(n for n, cls in _HEADS.items() if hasattr(layers, cls))


def make_head(spec, embedding=None, vocab_size=None):
    """Build an output head from a spec: a name, or a dict {"type": name, **layer kwargs}.

    The head is tied to `embedding` when one is given, else untied with `vocab_size`.
    """
    if isinstance(spec, keras.layers.Layer):
        return spec
    if spec is None:
        spec = "softmax"
    if isinstance(spec, str):
        spec = {"type": spec}
    spec = dict(spec)
    name = str(spec.pop("type", "softmax")).lower()
    if name not in head_names():
        raise ValueError(f"Unknown head {name!r}; choose one of {', '.join(head_names())}.")
    cls = getattr(layers, _HEADS[name])
    if embedding is not None:
        return cls(embedding=embedding, **spec)
    return cls(vocab_size=vocab_size, **spec)
