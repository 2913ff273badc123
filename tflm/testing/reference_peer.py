"""The reference implementations' models and training loop, in PyTorch, for parity checks.

Written after salesforce/awd-lstm-lm (model.py, main.py, finetune.py), zihangdai/mos and
nttcslab-nlp/doc_lm (model.py, main.py) with their layout and conventions: time-major
tensors (T, B), `torch.nn.LSTM` layers (weights and both biases b_ih, b_hh trained),
`nn.Linear` latent / prior layers, the mixture summed in probability space with the +1e-8 of
`torch.log(prob.add_(1e-8))`, and the loop of main.py: per window the group lr is set to
lr * seq_len / bptt, the loss is NLL + AR + TAR (+ DOC's var * cv^2), gradients are clipped
with `torch.nn.utils.clip_grad_norm_`, `optimizer.step()` runs and the lr is restored; the
switch replaces SGD by `torch.optim.ASGD(lr, t0=0, lambd=0., weight_decay)`.

Dropout as the references place it (every rate 0 by default, which the parity tests use):
embedding row dropout (embed_regularize.py), locked dropout on the embedded input, between
layers and on the last output (locked_dropout.py: one mask per stream, shared over time),
DropConnect on every `weight_hh_l0` (weightdrop.py: a fresh `F.dropout` mask per forward,
shared by the batch) and MoS' latent dropout; AR on the dropped last output, TAR on the raw
one. `ReferenceLoop.train_epoch` and `evaluate` are main.py's `train()` and `evaluate()`;
`reference_dynamic_eval` is the MoS code's `dynamiceval.py`.

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
                 components=None, alpha=2.0, beta=1.0, var=0.0, dropout=0.0, dropouth=0.0,
                 dropouti=0.0, dropoute=0.0, wdrop=0.0, dropoutl=0.0):
        super().__init__()
        self.dropout, self.dropouth, self.dropouti = dropout, dropouth, dropouti
        self.dropoute, self.wdrop, self.dropoutl = dropoute, wdrop, dropoutl
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

    def _locked_dropout(self, x, p):
        """x (T, B, D) times one Bernoulli(1 - p) / (1 - p) mask per stream."""
        if not self.training or not p:
            return x
        mask = x.new_empty(1, x.shape[1], x.shape[2]).bernoulli_(1 - p) / (1 - p)
        return x * mask

    def _embed(self, tokens):
        weight = self.encoder.weight
        if self.training and self.dropoute:
            rows = weight.new_empty(weight.shape[0], 1).bernoulli_(1 - self.dropoute)
            weight = weight * rows / (1 - self.dropoute)
        return F.embedding(tokens, weight)

    def _run_lstm(self, rnn, x, hidden):
        if not self.training or not self.wdrop:
            return rnn(x, hidden)
        params = dict(rnn.named_parameters())
        params["weight_hh_l0"] = F.dropout(params["weight_hh_l0"], p=self.wdrop)
        return torch.func.functional_call(rnn, params, (x, hidden))

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
        output = self._locked_dropout(self._embed(tokens), self.dropouti)
        new_hidden, outputs = [], []
        for l, rnn in enumerate(self.rnns):
            raw, h = self._run_lstm(rnn, output, hidden[l])
            new_hidden.append(h)
            last = l == len(self.rnns) - 1
            output = self._locked_dropout(raw, self.dropout if last else self.dropouth)
            outputs.append(output)
        prior = None
        if self.head == "softmax":
            log_prob = F.log_softmax(self.decoder(output), -1)
        elif self.head == "mos":
            latent = self._locked_dropout(torch.tanh(self.latent(output)), self.dropoutl)
            latent = latent.view(T, B, self.n_experts, self.ninp)
            log_prob, prior = self._mixture(latent, self.prior(output), T, B)
        else:
            if self.training and (self.dropoutl or self.dropouth or self.dropout):
                raise NotImplementedError("the DOC peer runs with dropout off only")
            used = [(o, c) for o, c in zip(outputs, self.components) if c > 0]
            parts = [torch.tanh(lin(o)).view(T, B, c, self.ninp)
                     for (o, c), lin in zip(used, self.latents)]
            log_prob, prior = self._mixture(torch.cat(parts, 2), self.prior(output), T, B)
        extra = self.alpha * output.pow(2).mean()
        extra = extra + self.beta * (raw[1:] - raw[:-1]).pow(2).mean()
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

    def train_epoch(self, train_data, rng, max_seq_len=None):
        """main.py's `train()`: windows of length max(5, int(N(bptt or bptt / 2, 5))) drawn
        with `rng` (numpy), capped at `max_seq_len` (MoS' bptt + max_seq_len_delta) and at
        the data's end, over `train_data` (T, B); the hidden state restarts at zero. Returns
        the mean training loss (NLL + regularizers) per window."""
        self.hidden, i, losses = None, 0, []
        while i < train_data.shape[0] - 1 - 1:
            bptt = self.bptt if rng.random() < 0.95 else self.bptt / 2.
            seq_len = max(5, int(rng.normal(bptt, 5)))
            if max_seq_len:
                seq_len = min(seq_len, max_seq_len)
            seq_len = min(seq_len, train_data.shape[0] - 1 - i)
            losses.append(self.step(train_data[i:i + seq_len], train_data[i + 1:i + 1 + seq_len]))
            i += seq_len
        return float(np.mean(losses))

    @torch.no_grad()
    def evaluate(self, data, batch_size):
        """main.py's `evaluate()` on `data` (T, B) in windows of bptt with carried state, with
        the averaged weights once ASGD runs; mean NLL per predicted token (the reference
        divides by len(data_source), one row more: a relative 1 / T difference)."""
        averaged = isinstance(self.optimizer, torch.optim.ASGD)
        if averaged:
            saved = {n: p.detach().clone() for n, p in self.model.named_parameters()}
            for n, p in self.model.named_parameters():
                p.copy_(self.optimizer.state[p]["ax"])
        self.model.eval()
        hidden, total, count = self.model.init_hidden(batch_size), 0.0, 0
        for i in range(0, data.shape[0] - 1, self.bptt):
            seq_len = min(self.bptt, data.shape[0] - 1 - i)
            log_prob, hidden, _ = self.model(data[i:i + seq_len], hidden)
            targets = data[i + 1:i + 1 + seq_len].reshape(-1)
            total += float(F.nll_loss(log_prob.view(-1, log_prob.size(2)), targets,
                                      reduction="sum"))
            count += targets.numel()
        if averaged:
            for n, p in self.model.named_parameters():
                p.copy_(saved[n])
        return total / count

    def averaged_parameters(self):
        """{name: ASGD's 'ax'} (what the references swap in for validation and saving)."""
        return {name: self.optimizer.state[p]["ax"].clone()
                for name, p in self.model.named_parameters()}


def reference_dynamic_eval(model, train_ids, eval_ids, lamb, lr, epsilon, batch_size=100,
                           bptt=5, max_batches=-1):
    """zihangdai/mos `dynamiceval.py` (old scaling, no `--ms`) on the peer `model`, in
    evaluation mode (the PyTorch-0.2 original: no dropout, no DropConnect): `gradstat()`
    on `train_ids` batchified into `batch_size` streams, then `evaluate()` on `eval_ids` at
    batch 1. Returns the perplexity; the model keeps the adapted weights."""
    model.eval()
    train = batchify(train_ids, batch_size)
    params = list(model.parameters())
    ms = [torch.zeros_like(p) for p in params]
    hidden, i, batches = model.init_hidden(batch_size), 0, 0
    while i < train.shape[0] - 1 - 1:
        seq_len = min(bptt, train.shape[0] - 1 - i)
        hidden = [(h.detach(), c.detach()) for h, c in hidden]
        model.zero_grad()
        log_prob, hidden, _ = model(train[i:i + seq_len], hidden)
        loss = F.nll_loss(log_prob.view(-1, log_prob.size(2)),
                          train[i + 1:i + 1 + seq_len].reshape(-1))
        loss.backward()
        for m, p in zip(ms, params):
            m += p.grad.detach() ** 2
        batches += 1
        i += seq_len
        if max_batches > 0 and batches >= max_batches:
            break
    ms = [torch.sqrt(m) for m in ms]
    gsum = sum(torch.mean(m) for m in ms)
    decrate = [torch.clamp(m / gsum, max=1 / lamb) for m in ms]
    data0 = [p.detach().clone() for p in params]
    data = batchify(eval_ids, 1)
    hidden, i, total, weight = model.init_hidden(1), 0, 0.0, 0.0
    seq_len0, seq_len, last = bptt, bptt, False
    while i < data.shape[0] - 1 - 1:
        if i + seq_len >= data.shape[0]:
            if last:
                break
            seq_len, last = data.shape[0] - i - 1, True
        seq_len_now = min(bptt, data.shape[0] - 1 - i)
        hidden = [(h.detach(), c.detach()) for h, c in hidden]
        model.zero_grad()
        log_prob, hidden, _ = model(data[i:i + seq_len_now], hidden)
        loss = F.nll_loss(log_prob.view(-1, log_prob.size(2)),
                          data[i + 1:i + 1 + seq_len_now].reshape(-1))
        loss.backward()
        with torch.no_grad():
            for p, d, p0, m in zip(params, decrate, data0, ms):
                p += lamb * d * (p0 - p) - lr * p.grad / (m + epsilon)
        total += seq_len / seq_len0 * float(loss.detach())
        weight += seq_len / seq_len0
        i += seq_len
    return float(np.exp(total / weight))


def batchify(ids, batch_size):
    """main.py's `batchify`: the first len // B * B ids as B streams, time-major (T, B)."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids) // batch_size
    return torch.as_tensor(ids[:n * batch_size].reshape(batch_size, n).T.copy())


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
