"""The Zaremba et al. (2014) backbone: embedding + LSTMs with dropout between layers only."""

import keras

from tflm.layers import StreamDropout, TiedEmbedding, WeightDropLSTM
from zoo.models.backbone_call import backbone_outputs, call_layer, run_layer, split_padding


def _seed(seed, offset):
    return None if seed is None else int(seed) + offset


def uniform_initializer(scale):
    """U(-scale, scale): the PTB tutorial's `tf.random_uniform_initializer(-init_scale,
    init_scale)`. Unseeded: draws follow `keras.utils.set_random_seed`. One per weight: a
    Keras initializer fixes its seed when made, so a shared one repeats its draws."""
    return keras.initializers.RandomUniform(-float(scale), float(scale))


@keras.saving.register_keras_serializable(package="zoo")
class ZarembaBackbone(keras.layers.Layer):
    """Embedding and L LSTM layers, dropout on the non-recurrent connections only.

        x_0 = D(E[w]);   r_l = LSTM_l(x_{l-1});   x_l = D(r_l)        (Zaremba eq. 4)

    D is ordinary dropout (a fresh mask per element and time step), drawn per stream
    (`tflm.layers.StreamDropout`: under MirroredStrategy the replicas' masks differ and
    equal one device's), on the embedded input and on every layer's output; the recurrent path h_{t-1} -> h_t is
    never dropped. Every LSTM has Keras' gate order, one bias and no forget-gate offset
    (TensorFlow's `BasicLSTMCell(forget_bias=0.0)`); the kernels and the embedding are drawn
    from U(-init_scale, init_scale), the LSTM biases start at zero (the TensorFlow cells'
    own initializer). The LSTMs are `tflm.layers.WeightDropLSTM` with no weight drop, so
    the fused kernel runs where the backend has one (`use_cudnn`).

    `call(tokens, states=None, training=False)` returns the dict of `zoo.AWDLSTMBackbone`:
    "sequence_output" (x_L), "layer_outputs" ([x_1..x_L]), "raw_layer_outputs"
    ([r_1..r_L]), "states" ([(h, c)] per layer) and "padding_mask" for padded windows.

    Args:
        vocab_size: V.
        hidden_dim: size of the embedding and of every LSTM layer (200 / 650 / 1500 for
            small / medium / large).
        num_layers: L (2).
        dropout: 1 - keep_prob (0 / 0.5 / 0.65).
        init_scale: s of U(-s, s) (0.1 / 0.05 / 0.04).
        tied_output_bias: whether the embedding carries an output bias for a tied head
            (`TiedEmbedding.use_output_bias`; made only when a head is tied to it).
            Default False.
        use_cudnn: "auto", True or False (`tflm.backends.lstm_kernels`).
        seed: seed of the dropout masks (None: nondeterministic).

    Reference: Zaremba, Sutskever & Vinyals 2014, "Recurrent Neural Network
    Regularization"; tensorflow/models tutorials/rnn/ptb/ptb_word_lm.py (PTBModel);
    Zhang 2018 §4.3, §5.
    """

    def __init__(self, vocab_size, hidden_dim=200, num_layers=2, dropout=0.0, init_scale=0.1,
                 tied_output_bias=False, use_cudnn="auto", seed=None, **kwargs):
        super().__init__(**kwargs)
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be >= 1; got {num_layers}.")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1) (1 - the tutorial's keep_prob); got "
                             f"{dropout}.")
        if not float(init_scale) > 0.0:
            raise ValueError(f"init_scale must be > 0 (weights ~ U(-s, s)); got {init_scale}.")
        if use_cudnn not in ("auto", True, False):
            raise ValueError(f"use_cudnn must be 'auto', True or False; got {use_cudnn!r}.")
        self.vocab_size = int(vocab_size)
        self.hidden_dim = int(hidden_dim)
        self.num_layers = int(num_layers)
        self.dropout = float(dropout)
        self.init_scale = float(init_scale)
        self.tied_output_bias = bool(tied_output_bias)
        self.use_cudnn = use_cudnn
        self.seed = seed
        self.embedding = TiedEmbedding(self.vocab_size, self.hidden_dim,
                                       embeddings_initializer=uniform_initializer(init_scale),
                                       use_output_bias=self.tied_output_bias, name="embedding")
        self.input_dropout = StreamDropout(self.dropout, seed=_seed(seed, 1),
                                           name="dropout_i")
        self.lstms, self.dropouts = [], []
        for i in range(self.num_layers):
            self.lstms.append(WeightDropLSTM(
                self.hidden_dim, weight_dropout=0.0, use_cudnn=use_cudnn,
                kernel_initializer=uniform_initializer(init_scale),
                recurrent_initializer=uniform_initializer(init_scale),
                bias_initializer="zeros", unit_forget_bias=False, return_sequences=True,
                return_state=True, name=f"lstm_{i}"))
            self.dropouts.append(StreamDropout(self.dropout, seed=_seed(seed, 10 + i),
                                               name=f"dropout_{i}"))

    def layer_sizes(self):
        """Hidden size of every LSTM layer (the size of each (h, c) pair)."""
        return [self.hidden_dim] * self.num_layers

    def build(self, input_shape=None):
        """Build the embedding and the LSTMs from shapes alone, in forward order (see
        `zoo.models.awd_lstm.awd_lstm_backbone.AWDLSTMBackbone.build`)."""
        if self.built:
            return
        self.embedding.build((None, None))
        for lstm in self.lstms:
            lstm.build((None, None, self.hidden_dim))
        self.built = True

    def call(self, tokens, states=None, training=False):
        tokens, mask = split_padding(tokens)
        x = call_layer(self.input_dropout, call_layer(self.embedding, tokens),
                       training=training)
        new_states, layer_outputs, raw_outputs = [], [], []
        for i, lstm in enumerate(self.lstms):
            raw, state = run_layer(lstm, x, None if states is None else states[i], mask,
                                   training)
            new_states.append(state)
            raw_outputs.append(raw)
            x = call_layer(self.dropouts[i], raw, training=training)
            layer_outputs.append(x)
        return backbone_outputs(x, layer_outputs, raw_outputs, new_states, mask)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, hidden_dim=self.hidden_dim,
                      num_layers=self.num_layers, dropout=self.dropout,
                      init_scale=self.init_scale, tied_output_bias=self.tied_output_bias,
                      use_cudnn=self.use_cudnn, seed=self.seed)
        return config
