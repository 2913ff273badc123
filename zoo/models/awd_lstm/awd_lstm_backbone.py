"""The AWD-LSTM backbone: tokens -> the hidden states of every layer (no output head)."""

import keras

from tflm.layers import (EmbeddingDropout, EmbeddingNoise, LockedDropout, SpectralEmbedding,
                         TiedEmbedding, WeightDropLSTM)
from tflm.regularizers import CosineSimilarityRegularizer
from zoo.models.backbone_call import backbone_outputs, call_layer, run_layer, split_padding


def _seed(seed, offset):
    return None if seed is None else int(seed) + offset


@keras.saving.register_keras_serializable(package="zoo")
class AWDLSTMBackbone(keras.layers.Layer):
    """Embedding, embedding / locked dropouts and weight-dropped LSTMs of AWD-LSTM.

        e = EmbeddingDropout(E)[w] (+ N(0, 1) * embedding_noise);  x_0 = LockedDropout_i(e)
        r_l = WeightDropLSTM_l(x_{l-1})                       (raw output of layer l)
        x_l = LockedDropout_h(r_l)  (l < L);   x_L = LockedDropout_o(r_L)

    `call(tokens, states=None, training=False)` returns a dict:

        "sequence_output"      x_L `(batch, time, last_dim)`: what an output head reads
        "layer_outputs"        [x_1, ..., x_L]: every layer's dropped output (DOC's heads)
        "raw_layer_outputs"    [r_1, ..., r_L]: before dropout (TAR, the cache pointer)
        "states"               [(h, c)] per layer after the window (carry them to the next)
        "padding_mask"         `(batch, time)` bool of real positions; only when the tokens
                               hold `tflm.data.PAD_ID` (the LSTMs hold their state through
                               padding; see `tflm.padding`)

    In evaluation mode (`training=False`) no dropout applies, so the layer outputs are the
    hidden states dynamic evaluation, the cache pointer and context-conditioned heads need.

    Args:
        vocab_size: V.
        embed_dim: embedding size (400 in the reference).
        hidden_dim: size of the inner LSTM layers (1150).
        num_layers: number of LSTM layers (3).
        last_dim: size of the last LSTM layer; defaults to `embed_dim` when `tie_weights`,
            else `hidden_dim`. The MoS reference uses 620 with an untied-size latent.
        tie_weights: whether the head will share the embedding (only sets `last_dim`'s
            default here; the task ties the head to `embedding`). Default True.
        dropout: locked dropout on the last layer's output (0.4).
        dropout_h: locked dropout between LSTM layers (0.3; "dropouth").
        dropout_i: locked dropout on the embedding output (0.65; "dropouti").
        dropout_e: embedding row dropout (0.1; "dropoute").
        weight_dropout: DropConnect on the recurrent matrices (0.5; "wdrop").
        use_cudnn: LSTM kernel, "auto" (fused where available), True (fused or an error),
            False (the portable loop); see `tflm.backends.lstm_kernels`. Default "auto".
        seed: seed of every dropout mask (None: nondeterministic).
        init: "keras" (default) or "pytorch": the LSTMs' initialisation (`WeightDropLSTM`;
            "pytorch" is `torch.nn.LSTM`'s, which every reference uses).
        lstm_biases: 1 (Keras' single bias, default) or 2 (PyTorch's trained b_ih and b_hh,
            as the reference LSTMs).
        embedding_noise: scale of the Gaussian noise added to the embedded window after
            embedding dropout, in training (`tflm.layers.EmbeddingNoise`; 0.15 in the
            AdvSoft code and lmkit). Default 0 (off).
        cosine_regularization: gamma of MLE-CosReg on E
            (`tflm.regularizers.CosineSimilarityRegularizer`). Default 0 (off).
        spectrum_control: None (default), True or a dict of `tflm.layers.SpectralEmbedding`
            options: E = U diag(s) V^T with spectrum control's penalties.

    Reference: Merity, Keskar & Socher 2018, "Regularizing and Optimizing LSTM Language
    Models" (salesforce/awd-lstm-lm, model.py RNNModel without its decoder).
    """

    def __init__(self, vocab_size, embed_dim=400, hidden_dim=1150, num_layers=3,
                 last_dim=None, tie_weights=True, dropout=0.4, dropout_h=0.3, dropout_i=0.65,
                 dropout_e=0.1, weight_dropout=0.5, use_cudnn="auto", seed=None, init="keras",
                 lstm_biases=1, embedding_noise=0.0, cosine_regularization=0.0,
                 spectrum_control=None, **kwargs):
        super().__init__(**kwargs)
        if lstm_biases not in (1, 2):
            raise ValueError(f"lstm_biases must be 1 (Keras) or 2 (PyTorch's b_ih and b_hh); "
                             f"got {lstm_biases!r}.")
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be >= 1; got {num_layers}.")
        if use_cudnn not in ("auto", True, False):
            raise ValueError(f"use_cudnn must be 'auto', True or False; got {use_cudnn!r}.")
        self.vocab_size = int(vocab_size)
        self.embed_dim = int(embed_dim)
        self.hidden_dim = int(hidden_dim)
        self.num_layers = int(num_layers)
        self.tie_weights = bool(tie_weights)
        self.last_dim = int(last_dim) if last_dim else (
            self.embed_dim if self.tie_weights else self.hidden_dim)
        self.dropout, self.dropout_h = float(dropout), float(dropout_h)
        self.dropout_i, self.dropout_e = float(dropout_i), float(dropout_e)
        self.weight_dropout = float(weight_dropout)
        self.use_cudnn = use_cudnn
        self.seed = seed
        self.init = init
        self.lstm_biases = int(lstm_biases)
        self.embedding_noise = float(embedding_noise)
        self.cosine_regularization = float(cosine_regularization)
        if spectrum_control is True:
            spectrum_control = {}
        if spectrum_control is not None and not isinstance(spectrum_control, dict):
            raise ValueError(f"spectrum_control must be None, True or a dict of "
                             f"SpectralEmbedding options; got {spectrum_control!r}.")
        self.spectrum_control = spectrum_control

        regularizer = (CosineSimilarityRegularizer(self.cosine_regularization)
                       if self.cosine_regularization else None)
        if spectrum_control is not None:
            if regularizer is not None:
                raise ValueError("cosine_regularization and spectrum_control both regularize "
                                 "the embedding; use one of them.")
            self.embedding = SpectralEmbedding(self.vocab_size, self.embed_dim,
                                               name="embedding", **spectrum_control)
        else:
            self.embedding = TiedEmbedding(self.vocab_size, self.embed_dim,
                                           embeddings_regularizer=regularizer,
                                           name="embedding")
        self.embedding_dropout = EmbeddingDropout(self.vocab_size, self.dropout_e,
                                                  seed=_seed(seed, 1), name="dropout_e")
        # Made only when on: a model without it has the variables of earlier releases.
        self.noise = (EmbeddingNoise(self.embedding_noise, seed=_seed(seed, 4),
                                     name="embedding_noise") if self.embedding_noise else None)
        self.input_dropout = LockedDropout(self.dropout_i, seed=_seed(seed, 2), name="dropout_i")
        self.lstms, self.hidden_dropouts = [], []
        for i in range(self.num_layers):
            self.lstms.append(WeightDropLSTM(
                self.layer_sizes()[i], weight_dropout=self.weight_dropout,
                seed=_seed(seed, 10 + i), use_cudnn=use_cudnn, init=init,
                recurrent_bias=self.lstm_biases == 2, return_sequences=True,
                return_state=True, name=f"lstm_{i}"))
            if i < self.num_layers - 1:
                self.hidden_dropouts.append(LockedDropout(
                    self.dropout_h, seed=_seed(seed, 20 + i), name=f"dropout_h_{i}"))
        self.output_dropout = LockedDropout(self.dropout, seed=_seed(seed, 3), name="dropout_o")

    def layer_sizes(self):
        """Hidden size of every LSTM layer (the size of each (h, c) pair)."""
        return [self.hidden_dim] * (self.num_layers - 1) + [self.last_dim]

    def build(self, input_shape=None):
        """Build the embedding and the LSTMs in the order a forward pass would (the same
        initial weights), from shapes alone: a forward pass on a dummy window ran the LSTM
        stack op by op on JAX, 3.7 s of the 200 / 400 x 3 PTB model's build."""
        if self.built:
            return
        self.embedding.build((None, None))
        features = self.embed_dim
        for lstm, units in zip(self.lstms, self.layer_sizes()):
            lstm.build((None, None, features))
            features = units
        self.built = True

    def call(self, tokens, states=None, training=False):
        tokens, mask = split_padding(tokens)
        x = call_layer(self.embedding, tokens)
        x = call_layer(self.embedding_dropout, tokens, x, training=training)
        if self.noise is not None:
            x = call_layer(self.noise, x, training=training)
        x = call_layer(self.input_dropout, x, training=training)
        new_states, layer_outputs, raw_outputs = [], [], []
        for i, lstm in enumerate(self.lstms):
            raw, state = run_layer(lstm, x, None if states is None else states[i], mask,
                                   training)
            new_states.append(state)
            raw_outputs.append(raw)
            dropout = (self.hidden_dropouts[i] if i < self.num_layers - 1
                       else self.output_dropout)
            x = call_layer(dropout, raw, training=training)
            layer_outputs.append(x)
        return backbone_outputs(x, layer_outputs, raw_outputs, new_states, mask)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, embed_dim=self.embed_dim, hidden_dim=self.hidden_dim,
            num_layers=self.num_layers, last_dim=self.last_dim, tie_weights=self.tie_weights,
            dropout=self.dropout, dropout_h=self.dropout_h, dropout_i=self.dropout_i,
            dropout_e=self.dropout_e, weight_dropout=self.weight_dropout,
            use_cudnn=self.use_cudnn, seed=self.seed, init=self.init,
            lstm_biases=self.lstm_biases, embedding_noise=self.embedding_noise,
            cosine_regularization=self.cosine_regularization,
            # every option resolved (derived constants, factor_scale): a saved model keeps
            # its penalties and storage when the defaults change
            spectrum_control=(None if self.spectrum_control is None
                              else self.embedding.spectrum_options()))
        return config
