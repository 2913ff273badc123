"""`tflm.batch_size.batch_size_of`: the batch size of a pass, read from what fit gets."""

import types

import keras
import numpy as np
import tensorflow as tf

from tflm.batch_size import batch_size_of, leading_dim


def test_arrays_use_the_keras_batch_size_or_all_rows():
    x = np.zeros((70, 5), "int32")
    assert batch_size_of(x)[0] == 32
    assert batch_size_of(x, 20)[0] == 20
    assert batch_size_of(x[:7], 20)[0] == 7
    assert batch_size_of((x, x), 10)[0] == 10
    assert leading_dim({"tokens": x[:3]}) == 3


def test_tf_data_reads_the_spec_and_peeks_only_when_asked():
    fixed = tf.data.Dataset.from_tensors(np.zeros((4, 6), "int32"))
    assert batch_size_of(fixed)[0] == 4
    unknown = tf.data.Dataset.from_generator(
        lambda: iter([np.zeros((3, 6), "int32")]),
        output_signature=tf.TensorSpec((None, 6), tf.int32))
    assert batch_size_of(unknown)[0] is None
    size, same = batch_size_of(unknown, peek=True)
    assert size == 3 and same is unknown


def test_a_peeked_generator_comes_back_whole():
    batches = [(np.full((2, 5), i, "int32"), np.full((2, 5), i, "int32")) for i in range(3)]
    gen = (b for b in batches)
    assert batch_size_of(gen)[0] is None  # not peeked: nothing read
    size, again = batch_size_of(gen, peek=True)
    assert size == 2 and isinstance(again, types.GeneratorType)
    assert [int(x[0, 0]) for x, _ in again] == [0, 1, 2]


def test_py_dataset_is_peeked_through_its_first_batch():
    class Windows(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return np.zeros((6, 4), "int32"), np.zeros((6, 4), "int32")

    assert batch_size_of(Windows())[0] is None
    assert batch_size_of(Windows(), peek=True)[0] == 6
