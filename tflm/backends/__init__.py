"""Backend-specific pieces of the language-model machinery (DESIGN contract 6).

Layers never import a backend; the few things Keras 3 does not abstract live here:
where the per-stream LSTM state is kept between BPTT windows (`stream_state`), and the
language-model train step (`train_step`), one implementation per backend."""

import keras


def backend_name():
    return keras.backend.backend()
