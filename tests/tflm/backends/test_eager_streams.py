"""`tflm.backends.streams.EagerStreamState`: the Python-held stream state of eager backends."""

import numpy as np
from keras import ops

from tflm.backends.streams import EagerStreamState


def test_ensure_holds_zeros_for_the_batch_unless_it_holds_that_many_streams():
    store = EagerStreamState([3, 2])
    assert store.ensure(4) is True
    assert [tuple(ops.shape(h)) + tuple(ops.shape(c)) for h, c in store.read(4, "float32")] \
        == [(4, 3, 4, 3), (4, 2, 4, 2)]
    assert all(not np.any(ops.convert_to_numpy(t)) for pair in store.read(4, "float32")
               for t in pair)
    written = [(ops.ones((4, 3)), ops.ones((4, 3))), (ops.ones((4, 2)), ops.ones((4, 2)))]
    store.write(written)
    assert store.ensure(4) is False  # kept: the state of the streams it holds
    assert float(ops.sum(store.read(4, "float32")[0][0])) == 12.0
    assert store.ensure(5) is True  # another batch size starts from zeros, as `read` does
    assert float(ops.sum(store.read(5, "float32")[0][0])) == 0.0
    store.reset()
    assert store.read(5, "float32")[1][1].shape == (5, 2)
