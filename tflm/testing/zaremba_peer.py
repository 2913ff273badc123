"""TensorFlow's PTB-tutorial model and training step in PyTorch, for parity checks.

Written after tensorflow/models tutorials/rnn/ptb/ptb_word_lm.py (PTBModel, run_epoch) with
PyTorch's own parts: `nn.Embedding`, one `nn.LSTM` per layer (one bias: b_hh fixed at zero and
not trained, so the parameters are the tutorial's), `nn.Linear` softmax, ordinary dropout on
the embedded input and on every layer's output (`DropoutWrapper(output_keep_prob)`), and
optionally Zhang 2018's MoS head (latent Linear(h, K h) + tanh, prior Linear(h, K), both
with bias, untied decoder), mixed in log space. One training step is the tutorial's:

    cost = sum_t mean_b NLL;   g = clip_by_global_norm(grad cost, max_grad_norm);
    theta -= lr * g                                       (GradientDescentOptimizer)

`load_keras_weights(peer, model)` copies a `zoo.ZarembaLSTM` into the peer (Keras and
PyTorch share the gate order i, f, g/c, o; kernels are transposed).
"""

import keras
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class ZarembaPeer(nn.Module):
    """The tutorial's PTBModel (batch-major tensors (B, T)); `num_experts` > 0: MoS."""

    def __init__(self, vocab_size, hidden, num_layers=2, dropout=0.0, num_experts=0):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.lstms = nn.ModuleList([nn.LSTM(hidden, hidden, 1, batch_first=True)
                                    for _ in range(num_layers)])
        for lstm in self.lstms:  # the tutorial's cells have one bias
            lstm.bias_hh_l0.requires_grad_(False).zero_()
        self.num_layers, self.dropout, self.num_experts = num_layers, dropout, num_experts
        self.hidden, self.vocab_size = hidden, vocab_size
        if num_experts:
            self.latent = nn.Linear(hidden, num_experts * hidden)
            self.prior = nn.Linear(hidden, num_experts)
        self.decoder = nn.Linear(hidden, vocab_size)

    def init_hidden(self, batch):
        zeros = torch.zeros(self.num_layers, batch, self.hidden)
        return zeros, zeros.clone()

    def forward(self, tokens, state):
        """(log-probabilities (B, T, V), new state)."""
        x = F.dropout(self.embedding(tokens), self.dropout, self.training)
        outputs, new_state = [], []
        h0, c0 = state
        for layer, lstm in enumerate(self.lstms):  # dropout between layers, never inside
            x, (h, c) = lstm(x, (h0[layer:layer + 1], c0[layer:layer + 1]))
            x = F.dropout(x, self.dropout, self.training)
            new_state.append((h, c))
        state = (torch.cat([h for h, _ in new_state]), torch.cat([c for _, c in new_state]))
        if not self.num_experts:
            return F.log_softmax(self.decoder(x), -1), state
        b, t, _ = x.shape
        latent = torch.tanh(self.latent(x)).view(b, t, self.num_experts, self.hidden)
        log_prior = F.log_softmax(self.prior(x), -1)
        log_probs = F.log_softmax(self.decoder(latent), -1)
        return torch.logsumexp(log_probs + log_prior.unsqueeze(-1), dim=2), state

    def tutorial_step(self, tokens, targets, state, lr, max_grad_norm):
        """One step of run_epoch's training: returns (cost, new state detached)."""
        self.zero_grad()
        log_probs, state = self(tokens, state)
        cost = -log_probs.gather(-1, targets.unsqueeze(-1)).sum() / tokens.shape[0]
        cost.backward()
        params = [p for p in self.parameters() if p.requires_grad]
        nn.utils.clip_grad_norm_(params, max_grad_norm)
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
        return cost.detach(), tuple(s.detach() for s in state)


def _keras_values(model):
    return {v.path.split("/", 1)[1]: keras.ops.convert_to_numpy(v) for v in model.weights}


def _one(values, suffix):
    [key] = [k for k in values if k.endswith(suffix)]
    return values[key]


def peer_names(peer):
    """{peer parameter: (Keras path suffix, transpose)}."""
    names = {"embedding.weight": ("embedding/embeddings", False)}
    for layer in range(peer.num_layers):
        names[f"lstms.{layer}.weight_ih_l0"] = (f"lstm_{layer}/lstm_cell/kernel", True)
        names[f"lstms.{layer}.weight_hh_l0"] = (f"lstm_{layer}/lstm_cell/recurrent_kernel",
                                                True)
        names[f"lstms.{layer}.bias_ih_l0"] = (f"lstm_{layer}/lstm_cell/bias", False)
    names["decoder.weight"] = ("/kernel", True)
    names["decoder.bias"] = ("/bias", False)
    if peer.num_experts:
        names.update({"latent.weight": ("latent_kernel", True),
                      "latent.bias": ("latent_bias", False),
                      "prior.weight": ("prior_kernel", True),
                      "prior.bias": ("prior_bias", False)})
    return names


def _head_suffix(values, suffix):
    """Head kernels: the decoder's "/kernel" / "/bias" must not match the LSTM cells'."""
    keys = [k for k in values if k.endswith(suffix) and "lstm" not in k
            and "latent" not in k and "prior" not in k]
    [key] = keys
    return values[key]


def load_keras_weights(peer, model):
    """Copy a `zoo.ZarembaLSTM`'s weights into the peer."""
    values = _keras_values(model)
    params = dict(peer.named_parameters())
    with torch.no_grad():
        for name, (suffix, transpose) in peer_names(peer).items():
            value = (_head_suffix(values, suffix) if name.startswith("decoder")
                     else _one(values, suffix))
            params[name].copy_(torch.as_tensor(np.asarray(value.T if transpose else value)))


def peer_weights_as_keras(peer):
    """{Keras path suffix: numpy array} of the peer's parameters in the Keras layout."""
    params = dict(peer.named_parameters())
    return {suffix: (params[name].detach().numpy().T if transpose
                     else params[name].detach().numpy())
            for name, (suffix, transpose) in peer_names(peer).items()}
