"""The BPTT windows as a `keras.utils.PyDataset`: the data pipeline that needs no TensorFlow.

Keras on JAX or PyTorch runs where TensorFlow is not installed (the usual GPU image); there
`lm_dataset`'s `tf.data` pipeline cannot be built. `WindowSequence` yields the same windows
as `lm_windows` and `lm_dataset` (with an int `epoch`) for the same arguments, window i of a
pass being `streams[:, s_i:s_i + T_i]` and its targets one position on, from (s_i, T_i) of
`window_starts`, cut by `cut_window` as `lm_windows` cuts them; `len()` is the pass's number
of windows, so `fit` knows its steps. Keras' `PyDataset` (not a generator of our own) because its data
adapter is the one every backend's `fit` / `evaluate` iterates natively; here it runs in the
calling thread (no workers): slicing a window costs microseconds.

`lm_batches` picks the pipeline for the running backend: `tf.data` on TensorFlow (where
`tf.distribute` needs it), `WindowSequence` on JAX and PyTorch. Both yield identical windows.

Example:

>>> import numpy as np
>>> [x.shape for x, y in WindowSequence(np.arange(22), 2, 4, train=False)]
[(2, 4), (2, 4), (2, 2)]
"""

import keras

from tflm.data.batching import as_streams, cut_window, lm_dataset, window_starts


class WindowSequence(keras.utils.PyDataset):
    """One pass's (x, y) windows; arguments as `lm_windows` (an int `epoch` for training
    windows: each epoch is its own sequence). For JAX and PyTorch: on TensorFlow, Keras
    turns a PyDataset into a `tf.data` pipeline with the first window's shape, which windows
    of other lengths then fail; `lm_batches` gives `lm_dataset` there."""

    def __init__(self, ids_or_streams, batch_size, bptt, *, train, seed=0, epoch=0,
                 max_len=None, pad_to_multiple=1, **rule):
        super().__init__()
        if train and epoch is None:
            raise ValueError("WindowSequence needs the epoch number for training windows "
                             "(each epoch's lengths are drawn from [seed, epoch]); "
                             "epoch=None is lm_dataset's, on TensorFlow.")
        self.streams = as_streams(ids_or_streams, batch_size)
        self.starts, self.lengths = window_starts(self.streams, batch_size, bptt, train=train,
                                                  seed=seed, epoch=epoch, max_len=max_len,
                                                  **rule)
        self.pad_to_multiple = pad_to_multiple

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} of a pass of {len(self)}")
        return cut_window(self.streams, int(self.starts[index]), int(self.lengths[index]),
                          self.pad_to_multiple)


def lm_batches(ids_or_streams, batch_size, bptt, *, train, seed=0, epoch=0, max_len=None,
               pad_to_multiple=1, **rule):
    """The windows for `fit` / `evaluate` on the running Keras backend: `lm_dataset`
    (`tf.data`) on TensorFlow, `WindowSequence` elsewhere; the same windows either way."""
    if keras.backend.backend() == "tensorflow":
        return lm_dataset(ids_or_streams, batch_size, bptt, train=train, seed=seed,
                          epoch=epoch, max_len=max_len, pad_to_multiple=pad_to_multiple,
                          **rule)
    return WindowSequence(ids_or_streams, batch_size, bptt, train=train, seed=seed,
                          epoch=epoch, max_len=max_len, pad_to_multiple=pad_to_multiple, **rule)
