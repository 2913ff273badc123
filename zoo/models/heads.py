"""Output heads by name, for presets and `python -m zoo.train --head NAME`."""

import inspect

import keras

from tflm import layers

# name -> (class name in tflm.layers, default keyword arguments)
_HEADS = {
    "softmax": ("SoftmaxLayer", {}),
    "mos": ("MoSLayer", {"num_experts": 15}),
    "moc": ("MoCLayer", {"num_experts": 15}),
    "gss": ("GSSHead", {"c": -1.5, "k": 2.5}),
    "ss": ("GSSHead", {"c": 0.0, "k": 2.0}),
    "plif": ("PLIFHead", {}),
    "mixtape": ("MixtapeLayer", {"num_components": 4}),
    "doc": ("DOCLayer", {"num_components_per_layer": [0, 5, 15]}),
    "node": ("NeuralODELogits", {}),
    "cnf": ("CNFHead", {"base": "softmax"}),
    "ccnf": ("ConditionalCNFHead", {}),
}


def head_names():
    """Names accepted by `make_head` (only those whose layer is available)."""
    return sorted(n for n, (cls, _) in _HEADS.items() if hasattr(layers, cls))


def make_head(spec, embedding=None, vocab_size=None, init=None):
    """Build an output head from a spec: a name, or a dict {"type": name, **layer kwargs}.

    Names: softmax, mos, moc, gss (defaults c=-1.5, k=2.5, the thesis' PTB choice), ss
    (SigSoftmax = GSS(0, 2)), plif, mixtape, doc (takes every layer's output; default
    components (0, 5, 15) for a 3-layer body), node (NeuralODELogits: an ODE on the
    logits, Andonov 2019), cnf (CNFHead: a flow of the output embeddings on a base head,
    {"type": "cnf", "base": "mos"}; default base softmax), ccnf (ConditionalCNFHead: a
    context-conditioned flow; {"num_samples": 20} trains it by importance sampling).
    The head is tied to `embedding` when one is
    given, else untied with `vocab_size`. `init` ("keras" or "pytorch") is the default of
    the heads that have an `init` argument; the spec's own `init` wins.
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
    class_name, defaults = _HEADS[name]
    kwargs = dict(defaults, **spec)
    if name == "ss" and (kwargs["c"], kwargs["k"]) != (0.0, 2.0):
        raise ValueError("head 'ss' is GSS(c=0, k=2); use head 'gss' for other (c, k).")
    if name == "cnf":
        kwargs["base"] = make_head(kwargs["base"], embedding=embedding,
                                   vocab_size=vocab_size, init=init)
    cls = getattr(layers, class_name)
    if init is not None and "init" in inspect.signature(cls.__init__).parameters:
        kwargs.setdefault("init", init)
    try:
        if embedding is not None:
            return cls(embedding=embedding, **kwargs)
        return cls(vocab_size=vocab_size, **kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments for head {name!r} ({class_name}): {err}") from err
