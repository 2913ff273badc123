"""The Mogrifier LSTM backbone: tokens -> the hidden states of every layer (no output head)."""

import keras

from tflm.layers import LockedDropout, MogrifierLSTM, StreamDropout, TiedEmbedding
from zoo.models.backbone_call import backbone_outputs, call_layer, run_layer, split_padding


def _seed(seed, offset):
    return None if seed is None else int(seed) + offset


@keras.saving.register_keras_serializable(package="zoo")
class MogrifierBackbone(keras.layers.Layer):
    """Embedding, dropouts and L Mogrifier LSTMs, wired as deepmind/lamb's language model:

        x_0 = D_in(E[w]);   r_1 = Mog_1(x_0);   r_l = Mog_l(D_inter(r_{l-1}))  (l > 1)
        s = r_1 + ... + r_L   (skip_connections, lamb's lstm_skip_connection)   or  s = r_L
        g = D_out(s);   with output_dim: g = D_out(g P)   (P: hidden_dim x output_dim, no bias)

    Each Mogrifier LSTM (`tflm.layers.MogrifierLSTM`) drops its h_{t-1} with
    `state_dropout` (one mask per sequence and window). D_in, D_inter and D_out are fresh
    masks per element and time step (`tflm.layers.StreamDropout`: lamb's
    `shared_mask_dropout=false`, the tuned configs' setting) or one mask per sequence
    (`LockedDropout`, `shared_mask_dropout=True`). The projection P is lamb's down-projection
    of the cell output to the output embedding's size, made only when a tied softmax needs it
    (`output_dim`; the MoS head projects by itself); the second D_out is lamb's
    `downprojected_output_dropout` at its default, the output dropout.

    `call(tokens, states=None, training=False)` returns the dict of `zoo.AWDLSTMBackbone`:
    "sequence_output" (g, what the head reads), "layer_outputs" ([r_1, ..., r_{L-1}, g]),
    "raw_layer_outputs" ([r_1..r_L], undropped), "states" ([(h, c)] per layer) and
    "padding_mask" for padded windows.

    Args:
        vocab_size: V.
        embed_dim: embedding size (lamb: input_embedding_ratio x hidden size).
        hidden_dim: every Mogrifier LSTM's size.
        num_layers: L.
        rounds, rank: the Mogrifier's r and k (rank 0 or None: full matrices).
        input_dropout, inter_layer_dropout, state_dropout, output_dropout: lamb's four
            dropout rates (the first three inside its cell, the last on the cell output).
        shared_mask_dropout: one mask per sequence for D_in, D_inter, D_out (LockedDropout)
            instead of per step. Default False (lamb's tuned configs).
        skip_connections: the output is the sum of the layers' outputs. Default True.
        cap_input_gate: the LSTMs' c = f c + min(i, 1 - f) g. Default True (lamb's).
        forget_bias: the forget gates' initial bias. Default 1.
        output_dim: size of the down-projection P, or None for none. Default None.
        init: "lamb" (default: truncated normals of variance 1 / fan_in for the cells,
            1 / embed_dim for the embedding, lamb's `variance_scaling_initializer` with
            factor 1; orthogonal P) or "keras" (Keras' LSTM initialisation, the embedding
            U(-0.1, 0.1)).
        seed: seed of every dropout mask (None: nondeterministic).
        unroll: the layers' time loops written out step by step (`MogrifierLSTM`'s
            `unroll`). Default False.

    Reference: Melis, Kočiský & Blunsom 2020; deepmind/lamb lamb/lm.py, lamb/cell.py
    (build_cell), lamb/skip_multi_rnn_cell.py.
    """

    def __init__(self, vocab_size, embed_dim=912, hidden_dim=912, num_layers=2, rounds=5,
                 rank=84, input_dropout=0.0, inter_layer_dropout=0.0, state_dropout=0.0,
                 output_dropout=0.0, shared_mask_dropout=False, skip_connections=True,
                 cap_input_gate=True, forget_bias=1.0, output_dim=None, init="lamb",
                 seed=None, unroll=False, **kwargs):
        super().__init__(**kwargs)
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be >= 1; got {num_layers}.")
        if init not in ("lamb", "keras"):
            raise ValueError(f"init must be 'lamb' or 'keras'; got {init!r}.")
        self.vocab_size = int(vocab_size)
        self.embed_dim = int(embed_dim)
        self.hidden_dim = int(hidden_dim)
        self.num_layers = int(num_layers)
        self.rounds = int(rounds)
        self.rank = int(rank) or None if rank is not None else None  # 0: full, as lamb
        self.input_dropout_rate = float(input_dropout)
        self.inter_layer_dropout_rate = float(inter_layer_dropout)
        self.state_dropout = float(state_dropout)
        self.output_dropout_rate = float(output_dropout)
        self.shared_mask_dropout = bool(shared_mask_dropout)
        self.skip_connections = bool(skip_connections)
        self.cap_input_gate = bool(cap_input_gate)
        self.forget_bias = float(forget_bias)
        self.output_dim = None if output_dim is None else int(output_dim)
        self.init = init
        self.seed = seed
        self.unroll = bool(unroll)
        dropout = LockedDropout if self.shared_mask_dropout else StreamDropout
        embedding_init = (keras.initializers.VarianceScaling(1.0, "fan_out", "truncated_normal")
                          if init == "lamb" else None)
        self.embedding = TiedEmbedding(self.vocab_size, self.embed_dim,
                                       embeddings_initializer=embedding_init, name="embedding")
        self.input_dropout = dropout(self.input_dropout_rate, seed=_seed(seed, 1),
                                     name="dropout_in")
        self.lstms, self.inter_layer_dropouts = [], []
        for i in range(self.num_layers):
            if i > 0:
                self.inter_layer_dropouts.append(dropout(
                    self.inter_layer_dropout_rate, seed=_seed(seed, 20 + i),
                    name=f"dropout_inter_{i}"))
            self.lstms.append(MogrifierLSTM(
                self.hidden_dim, rounds=self.rounds, rank=self.rank,
                state_dropout=self.state_dropout, cap_input_gate=self.cap_input_gate,
                forget_bias=self.forget_bias, init=init, seed=_seed(seed, 10 + i),
                return_sequences=True, return_state=True, unroll=self.unroll,
                name=f"mogrifier_{i}"))
        self.output_dropout = dropout(self.output_dropout_rate, seed=_seed(seed, 3),
                                      name="dropout_out")
        self.projection = self.projection_dropout = None
        if self.output_dim is not None:  # made only when on: no unused variables otherwise
            self.projection = keras.layers.Dense(self.output_dim, use_bias=False,
                                                 kernel_initializer="orthogonal",
                                                 name="projection")
            self.projection_dropout = dropout(self.output_dropout_rate, seed=_seed(seed, 4),
                                              name="dropout_projected")

    def layer_sizes(self):
        """Hidden size of every Mogrifier LSTM layer (the size of each (h, c) pair)."""
        return [self.hidden_dim] * self.num_layers

    @property
    def output_size(self):
        """The size of "sequence_output" (what a head reads)."""
        if self.output_dim is not None:
            return self.output_dim
        return self.hidden_dim

    def build(self, input_shape=None):
        """Build the embedding, the LSTMs and the projection from shapes alone, in forward
        order (see `zoo.models.awd_lstm.awd_lstm_backbone.AWDLSTMBackbone.build`)."""
        if self.built:
            return
        self.embedding.build((None, None))
        features = self.embed_dim
        for lstm in self.lstms:
            lstm.build((None, None, features))
            features = self.hidden_dim
        if self.projection is not None:
            self.projection.build((None, None, self.hidden_dim))
        self.built = True

    def call(self, tokens, states=None, training=False):
        tokens, mask = split_padding(tokens)
        x = call_layer(self.input_dropout, call_layer(self.embedding, tokens),
                       training=training)
        new_states, raw_outputs = [], []
        for i, lstm in enumerate(self.lstms):
            if i > 0:
                x = call_layer(self.inter_layer_dropouts[i - 1], x, training=training)
            x, state = run_layer(lstm, x, None if states is None else states[i], mask,
                                 training)
            new_states.append(state)
            raw_outputs.append(x)
        summed = raw_outputs[0]
        if self.skip_connections:
            for raw in raw_outputs[1:]:
                summed = summed + raw
        else:
            summed = raw_outputs[-1]
        g = call_layer(self.output_dropout, summed, training=training)
        if self.projection is not None:
            g = call_layer(self.projection_dropout, call_layer(self.projection, g),
                           training=training)
        return backbone_outputs(g, raw_outputs[:-1] + [g], raw_outputs, new_states, mask)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, embed_dim=self.embed_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, rounds=self.rounds, rank=self.rank,
            input_dropout=self.input_dropout_rate,
            inter_layer_dropout=self.inter_layer_dropout_rate,
            state_dropout=self.state_dropout, output_dropout=self.output_dropout_rate,
            shared_mask_dropout=self.shared_mask_dropout,
            skip_connections=self.skip_connections, cap_input_gate=self.cap_input_gate,
            forget_bias=self.forget_bias, output_dim=self.output_dim, init=self.init,
            seed=self.seed, unroll=self.unroll)
        return config
