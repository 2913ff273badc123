"""The reference implementations' models and training loop, in PyTorch, for parity checks.

Written after salesforce/awd-lstm-lm (model.py, main.py, finetune.py), zihangdai/mos and
nttcslab-nlp/doc_lm (model.py, main.py) with their layout and conventions: time-major
tensors (T, B), `torch.nn.LSTM` layers (weights and both biases b_ih, b_hh trained),
`nn.Linear` latent / prior layers, the mixture summed in probability space with the +1e-8 of
`torch.log(prob.add_(1e-8))`, and the loop of main.py: per window the group lr is set to
lr * seq_len / bptt, the loss is NLL + AR + TAR (+ DOC's var * cv^2), gradients are clipped
with `torch.nn.utils.clip_grad_norm_`, `optimizer.step()` runs and the lr is restored; the
switch replaces SGD by `torch.optim.ASGD(lr, t0=0, lambd=0., weight_decay)`.

Dropout is not implemented (the parity tests run with every dropout off; the dropout paths are
compared statistically elsewhere), so `WeightDrop` reduces to the plain `nn.LSTM` it wraps.

`load_keras_weights(peer, model)` copies a `zoo.AWDLSTM` built with `lstm_biases=2` into the
peer (transposing kernels; Keras and PyTorch share the gate order i, f, g/c, o).
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class ReferenceRNNModel(nn.Module):
    """RNNModel of the references with a softmax ("softmax"), MoS ("mos") or DOC ("doc") top.

    `components` (DOC): per LSTM layer, how many components it feeds (num4first, num4second,
    ..., n_experts last), as `tflm.layers.DOCLayer`'s `num_components_per_layer`."""

    def __init__(self, ntoken, ninp, nhid, nhidlast, nlayers, head="softmax", n_experts=1,
                 components=None, alpha=2.0, beta=1.0, var=0.0):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnns = nn.ModuleList(
            [nn.LSTM(ninp if l == 0 else nhid, nhid if l != nlayers - 1 else nhidlast, 1)
             for l in range(nlayers)])
        self.decoder = nn.Linear(ninp, ntoken)
        self.decoder.weight = self.encoder.weight  # tied
        self.head, self.ninp, self.ntoken = head, ninp, ntoken
        self.alpha, self.beta, self.var = alpha, beta, var
        if head == "mos":
            self.n_experts = n_experts
            self.prior = nn.Linear(nhidlast, n_experts, bias=False)
            self.latent = nn.Linear(nhidlast, n_experts * ninp)
        elif head == "doc":
            self.components = list(components)
            self.n_experts = sum(self.components)
            self.prior = nn.Linear(nhidlast, self.n_experts, bias=False)
            self.latents = nn.ModuleList(
                [nn.Linear(self.rnns[l].hidden_size, count * ninp)
                 for l, count in enumerate(self.components) if count > 0])

    def init_hidden(self, bsz):
        return [(torch.zeros(1, bsz, rnn.hidden_size), torch.zeros(1, bsz, rnn.hidden_size))
                for rnn in self.rnns]

    def _mixture(self, contexts, prior_logit, T, B):
        """contexts (T, B, K, ninp) -> log(sum_k pi_k softmax(h_k E^T + b) + 1e-8)."""
        logit = self.decoder(contexts.reshape(-1, self.ninp))
        prior = F.softmax(prior_logit.reshape(-1, contexts.shape[2]), -1)
        prob = F.softmax(logit.view(-1, self.ntoken), -1).view(-1, contexts.shape[2],
                                                                self.ntoken)
        prob = (prob * prior.unsqueeze(2)).sum(1)
        return torch.log(prob + 1e-8).view(T, B, self.ntoken), prior.view(T, B, -1)

    def forward(self, tokens, hidden):
        """tokens (T, B) -> (log-probs (T, B, V), new hidden, extra loss AR + TAR (+ CV))."""
        T, B = tokens.shape
        output = self.encoder(tokens)
        new_hidden, outputs = [], []
        for l, rnn in enumerate(self.rnns):
            output, h = rnn(output, hidden[l])
            new_hidden.append(h)
            outputs.append(output)
        prior = None
        if self.head == "softmax":
            log_prob = F.log_softmax(self.decoder(output), -1)
        elif self.head == "mos":
            latent = torch.tanh(self.latent(output)).view(T, B, self.n_experts, self.ninp)
            log_prob, prior = self._mixture(latent, self.prior(output), T, B)
        else:
            used = [(o, c) for o, c in zip(outputs, self.components) if c > 0]
            parts = [torch.tanh(lin(o)).view(T, B, c, self.ninp)
                     for (o, c), lin in zip(used, self.latents)]
            log_prob, prior = self._mixture(torch.cat(parts, 2), self.prior(output), T, B)
        extra = self.alpha * output.pow(2).mean()
        extra = extra + self.beta * (output[1:] - output[:-1]).pow(2).mean()
        if self.var and prior is not None:
            prior_sum = prior.sum(0)
            cv = (prior_sum.var() * (prior_sum.size(1) - 1)).sqrt() / prior_sum.mean()
            extra = extra + self.var * cv * cv
        return log_prob, new_hidden, extra


class ReferenceLoop:
    """main.py's `train()` for one window at a time, then the switch to ASGD."""

    def __init__(self, model, lr, bptt, clip=0.25, wdecay=1.2e-6):
        self.model, self.lr, self.bptt, self.clip, self.wdecay = model, lr, bptt, clip, wdecay
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wdecay)
        self.hidden = None

    def switch_to_asgd(self):
        self.optimizer = torch.optim.ASGD(self.model.parameters(), lr=self.lr, t0=0,
                                          lambd=0., weight_decay=self.wdecay)

    def step(self, data, targets):
        """One window: data, targets (T, B) int64."""
        seq_len = data.shape[0]
        lr2 = self.optimizer.param_groups[0]["lr"]
        self.optimizer.param_groups[0]["lr"] = lr2 * seq_len / self.bptt
        self.model.train()
        if self.hidden is None:
            self.hidden = self.model.init_hidden(data.shape[1])
        self.hidden = [(h.detach(), c.detach()) for h, c in self.hidden]
        self.optimizer.zero_grad()
        log_prob, self.hidden, extra = self.model(data, self.hidden)
        loss = F.nll_loss(log_prob.view(-1, log_prob.size(2)), targets.reshape(-1)) + extra
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.param_groups[0]["lr"] = lr2
        return float(loss.detach())

    def averaged_parameters(self):
        """{name: ASGD's 'ax'} (what the references swap in for validation and saving)."""
        return {name: self.optimizer.state[p]["ax"].clone()
                for name, p in self.model.named_parameters()}


def _keras_by_suffix(model):
    return {v.path.split("/", 1)[1]: np.asarray(v.numpy() if hasattr(v, "numpy") else v)
            for v in model.weights}


def peer_to_keras_names(peer):
    """{peer parameter name: (Keras variable path without the model prefix, transpose?)}."""
    names = {"encoder.weight": ("backbone/embedding/embeddings", False),
             "decoder.bias": ("backbone/embedding/output_bias", False)}
    for l in range(len(peer.rnns)):
        base = f"backbone/lstm_{l}"
        names[f"rnns.{l}.weight_ih_l0"] = (f"{base}/lstm_cell/kernel", True)
        names[f"rnns.{l}.weight_hh_l0"] = (f"{base}/lstm_cell/recurrent_kernel", True)
        names[f"rnns.{l}.bias_ih_l0"] = (f"{base}/lstm_cell/bias", False)
        names[f"rnns.{l}.bias_hh_l0"] = (f"{base}/recurrent_bias", False)
    if peer.head == "mos":
        names.update({"latent.weight": ("mo_s_layer/latent_kernel", True),
                      "latent.bias": ("mo_s_layer/latent_bias", False),
                      "prior.weight": ("mo_s_layer/prior_kernel", True)})
    if peer.head == "doc":
        used = [l for l, c in enumerate(peer.components) if c > 0]
        for j, l in enumerate(used):
            names[f"latents.{j}.weight"] = (f"doc_layer/latent_kernel_{l}", True)
            names[f"latents.{j}.bias"] = (f"doc_layer/latent_bias_{l}", False)
        names["prior.weight"] = ("doc_layer/prior_kernel", True)
    return names


def _match(keras_values, suffix):
    hits = [k for k in keras_values if k.endswith(suffix)]
    if len(hits) != 1:
        raise KeyError(f"{suffix}: {len(hits)} Keras variables match ({sorted(keras_values)})")
    return keras_values[hits[0]]


@torch.no_grad()
def load_keras_weights(peer, model):
    """Copy the Keras model's weights into the peer (float32)."""
    values = _keras_by_suffix(model)
    params = dict(peer.named_parameters())
    for name, (suffix, transpose) in peer_to_keras_names(peer).items():
        value = _match(values, suffix)
        params[name].copy_(torch.as_tensor(value.T if transpose else value))


def peer_weights_as_keras(peer, params=None):
    """{Keras path suffix: numpy array} of the peer's parameters (or of `params`, e.g. the
    ASGD averages), in the Keras layout."""
    params = dict(peer.named_parameters()) if params is None else params
    out = {}
    for name, (suffix, transpose) in peer_to_keras_names(peer).items():
        value = params[name].detach().numpy()
        out[suffix] = value.T if transpose else value
    return out
