"""How many rows the batches of a pass will have, read from what fit / evaluate / predict get.

A language model must size its carried state before a pass starts (XLA cannot resize a
variable inside a compiled step; JAX must have the state variables before the jitted step
fetches them). `batch_size_of` answers from the data alone:

- NumPy arrays and tensors: `batch_size` rows (Keras' default 32), or all when fewer;
- a `tf.data.Dataset`: the static batch dimension of its element spec;
- with `peek=True`, also a `keras.utils.PyDataset` (its first batch), a `tf.data.Dataset`
  of unknown batch dimension and a generator (its first element, put back in front);
- a torch `DataLoader`: its `batch_size`.

Anything else (a distributed dataset: per-replica rows are the strategy's business) gives
None: the pass then sizes the state from its first batch where the backend allows it.
"""

import keras
from keras import tree


def leading_dim(x):
    """The static batch size of the first tensor in `x`, or None."""
    for item in tree.flatten(x):
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) and shape[0] is not None:
            return int(shape[0])
    return None


def _put_back(first, rest):
    """A generator (what Keras' data adapters accept) yielding `first`, then `rest`."""
    yield first
    yield from rest


def _is_keras_py_dataset(x):
    return isinstance(x, keras.utils.PyDataset)


def batch_size_of(x, batch_size=None, peek=False):
    """`(rows per batch or None, x)`; `x` comes back unchanged except a peeked generator,
    which comes back with its first element put back in front."""
    if x is None or type(x).__name__.startswith("Distributed"):
        return None, x
    spec = getattr(x, "element_spec", None)
    if spec is not None:  # tf.data.Dataset
        size = leading_dim(spec)
        if size is None and peek:
            size = leading_dim(next(iter(x)))
        return size, x
    if _is_keras_py_dataset(x):
        return (leading_dim(x[0]) if peek and len(x) else None), x
    loader_size = getattr(x, "batch_size", None)
    if isinstance(loader_size, int) and hasattr(x, "__iter__"):  # torch DataLoader
        return loader_size, x
    if hasattr(x, "__next__"):  # a generator or iterator
        if not peek:
            return None, x
        try:
            first = next(x)
        except StopIteration:
            return None, iter(())
        return leading_dim(first), _put_back(first, x)
    rows = leading_dim(x)
    if rows is None:
        return None, x
    return min(rows, int(batch_size or 32)), x
