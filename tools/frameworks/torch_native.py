"""A plain PyTorch AWD-LSTM with softmax, MoS and MoC heads: the native reference peer.

`python tools/compare_frameworks.py` runs this next to the Keras model on every backend, from
the same initial weights, data and batch order. It is written from the formulas (REFERENCE
§2, §1), in ordinary PyTorch idiom, with no Keras and no tflm import:

    e = (E * z)[w],  z ~ Bernoulli(1 - p_e)^V / (1 - p_e)       embedding row dropout
    x_0 = m_i * e                                                 locked dropout, m (B, 1, d)
    W~_hh = W_hh * M / (1 - p_w)                                  weight drop, one M per window
    x_l = m_h * LSTM_l(x_{l-1}; W_ih, W~_hh, b)                   (no dropout after the last)
    g = m_o * x_L
    softmax: log P = log_softmax(g E^T + b)
    MoS:     h_k = m_l * tanh(W_lat g + b_lat)_k,  pi = softmax(W_pi g)
             log P = logsumexp_k [log pi_k + log_softmax(h_k E^T + b)]
    MoC:     log P = log_softmax((sum_k pi_k h_k) E^T + b)
    loss = mean NLL + alpha * mean(g^2) + beta * mean((x_L[t+1] - x_L[t])^2)

Training step (salesforce/awd-lstm-lm main.py): backward, `torch.nn.utils.clip_grad_norm_`
(coefficient min(1, clip / (||g|| + 1e-6)), as `tflm.backends.gradients.clip_and_scale`), then
`torch.optim.SGD(lr * T / bptt, weight_decay)`. The LSTM state is carried across windows,
detached, and zeroed at the start of each pass.

Layout against a Keras `zoo.AWDLSTM` (`load_roles` / `export_roles` map by role; the Keras
side of the mapping is `tools.frameworks.roles`):
Keras LSTM kernel (in, 4n), recurrent_kernel (n, 4n), bias (4n) with gates (i, f, c, o);
torch keeps weight_ih (4n, in) = kernel^T, weight_hh (4n, n) = recurrent_kernel^T, gates
(i, f, g, o) in the same order, and has two biases: b_ih = bias and b_hh = 0 (a zero buffer,
not a parameter, so the parameter count and the update equal the Keras model's). MoS/MoC:
Keras latent_kernel (in, K L) -> nn.Linear weight (K L, in); prior_kernel (in, K) ->
nn.Linear(bias=False) weight (K, in). Tied decoder: F.linear(h, E, b).

Each LSTM layer calls `torch.lstm` (what nn.LSTM calls) with the dropped recurrent matrix
recomputed every forward, so on a GPU the cuDNN kernel runs (weights not flattened, hence one
copy per call).

Reference: Merity, Keskar & Socher 2018 (AWD-LSTM); Yang et al. 2018 (MoS, MoC).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from tools.frameworks.torch_zaremba import from_zaremba_config


def _locked_mask(shape, rate, like, generator):
    """Bernoulli(1 - rate) / (1 - rate) mask of `shape` (time axis already 1)."""
    keep = 1.0 - rate
    mask = torch.empty(shape, device=like.device, dtype=like.dtype)
    return mask.bernoulli_(keep, generator=generator) / keep


class LockedDropout(nn.Module):
    """Variational dropout: one mask per sequence (and per trailing slice), shared over time."""

    def __init__(self, rate):
        super().__init__()
        self.rate = float(rate)
        self.generator = None

    def forward(self, x):
        if not self.training or self.rate == 0.0:
            return x
        shape = (x.shape[0], 1) + tuple(x.shape[2:])
        return x * _locked_mask(shape, self.rate, x, self.generator)


class WeightDropLSTM(nn.Module):
    """One LSTM layer with DropConnect on weight_hh and a single bias (b_hh fixed at 0)."""

    def __init__(self, input_size, hidden_size, weight_dropout=0.0):
        super().__init__()
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.weight_dropout = float(weight_dropout)
        bound = 1.0 / math.sqrt(self.hidden_size)
        n4 = 4 * self.hidden_size
        self.weight_ih = nn.Parameter(torch.empty(n4, self.input_size).uniform_(-bound, bound))
        self.weight_hh = nn.Parameter(torch.empty(n4, self.hidden_size).uniform_(-bound, bound))
        self.bias_ih = nn.Parameter(torch.zeros(n4))
        self.register_buffer("bias_hh", torch.zeros(n4), persistent=False)
        self.generator = None

    def forward(self, x, state):
        """x (B, T, in), state (h, c) each (B, n) -> (outputs (B, T, n), (h, c))."""
        weight_hh = self.weight_hh
        if self.training and self.weight_dropout > 0.0:
            weight_hh = weight_hh * _locked_mask(weight_hh.shape, self.weight_dropout,
                                                 weight_hh, self.generator)
        h0, c0 = state
        params = [self.weight_ih, weight_hh, self.bias_ih, self.bias_hh]
        if x.dtype != params[0].dtype:  # mixed precision: the LSTM runs in x's dtype
            params = [p.to(x.dtype) for p in params]
        h0, c0 = h0.to(x.dtype), c0.to(x.dtype)
        out, h, c = torch.lstm(x, (h0.unsqueeze(0), c0.unsqueeze(0)), params, True, 1, 0.0,
                               self.training, False, True)
        return out, (h.squeeze(0), c.squeeze(0))


class NativeAWDLSTM(nn.Module):
    """AWD-LSTM body + softmax / MoS / MoC head in plain PyTorch (batch-first).

    Args: as `zoo.AWDLSTM` (vocab_size, embed_dim, hidden_dim, num_layers, last_dim,
    tie_weights, dropout, dropout_h, dropout_i, dropout_e, weight_dropout, alpha, beta), plus
    `head` ("softmax", "mos" or "moc"), `num_experts` (K) and `latent_dropout` for MoS/MoC,
    and `seed` for the dropout generator.

    `forward(tokens, states)` returns (log_probs (B, T, V) float32, new states [(h, c)],
    extra loss AR + TAR (0 in eval mode)).
    """

    def __init__(self, vocab_size, embed_dim=400, hidden_dim=1150, num_layers=3, last_dim=None,
                 tie_weights=True, dropout=0.4, dropout_h=0.3, dropout_i=0.65, dropout_e=0.1,
                 weight_dropout=0.5, alpha=2.0, beta=1.0, head="softmax", num_experts=15,
                 latent_dropout=0.0, seed=None):
        super().__init__()
        head = str(head).lower()
        if head not in ("softmax", "mos", "moc"):
            raise ValueError(f"NativeAWDLSTM supports the softmax, mos and moc heads; got "
                             f"head={head!r}.")
        self.vocab_size, self.embed_dim = int(vocab_size), int(embed_dim)
        self.hidden_dim, self.num_layers = int(hidden_dim), int(num_layers)
        self.tie_weights = bool(tie_weights)
        self.last_dim = int(last_dim) if last_dim else (
            self.embed_dim if self.tie_weights else self.hidden_dim)
        self.dropout_e, self.alpha, self.beta = float(dropout_e), float(alpha), float(beta)
        self.head_type, self.num_experts = head, int(num_experts)

        self.encoder = nn.Embedding(self.vocab_size, self.embed_dim)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        self.decoder_bias = nn.Parameter(torch.zeros(self.vocab_size))
        self.input_dropout = LockedDropout(dropout_i)
        self.rnns = nn.ModuleList()
        self.hidden_dropouts = nn.ModuleList()
        for i in range(self.num_layers):
            size_in = self.embed_dim if i == 0 else self.hidden_dim
            size_out = self.last_dim if i == self.num_layers - 1 else self.hidden_dim
            self.rnns.append(WeightDropLSTM(size_in, size_out, weight_dropout))
            if i < self.num_layers - 1:
                self.hidden_dropouts.append(LockedDropout(dropout_h))
        self.output_dropout = LockedDropout(dropout)

        if not self.tie_weights:
            raise ValueError("NativeAWDLSTM mirrors the tied AWD-LSTM only (tie_weights=True).")
        proj_dim = self.embed_dim
        if head == "softmax":
            if self.last_dim != self.embed_dim:
                raise ValueError(f"a tied softmax needs last_dim == embed_dim; got last_dim="
                                 f"{self.last_dim}, embed_dim={self.embed_dim}.")
        else:
            self.latent = nn.Linear(self.last_dim, self.num_experts * proj_dim)
            nn.init.zeros_(self.latent.bias)
            self.prior = nn.Linear(self.last_dim, self.num_experts, bias=False)
            self.latent_dropout = LockedDropout(latent_dropout)
        self.proj_dim = proj_dim
        self.set_seed(seed)

    def set_seed(self, seed):
        """One torch.Generator (on the parameters' device) for every dropout mask."""
        device = self.encoder.weight.device
        self.generator = torch.Generator(device=device)
        if seed is not None:
            self.generator.manual_seed(int(seed))
        for module in self.modules():
            if isinstance(module, (LockedDropout, WeightDropLSTM)):
                module.generator = self.generator

    def decoder(self):
        return self.encoder.weight

    def zero_states(self, batch_size):
        weight = self.encoder.weight
        return [(weight.new_zeros(batch_size, rnn.hidden_size),
                 weight.new_zeros(batch_size, rnn.hidden_size)) for rnn in self.rnns]

    def embed(self, tokens):
        e = self.encoder(tokens)
        if self.training and self.dropout_e > 0.0:
            keep = 1.0 - self.dropout_e
            rows = torch.empty(self.vocab_size, 1, device=e.device, dtype=e.dtype)
            rows = rows.bernoulli_(keep, generator=self.generator) / keep
            e = e * F.embedding(tokens, rows)
        return e

    def head(self, g):
        weight, bias = self.decoder(), self.decoder_bias
        if self.head_type == "softmax":
            return F.log_softmax(F.linear(g, weight, bias).float(), dim=-1)
        latent = torch.tanh(self.latent(g))
        latent = latent.view(*g.shape[:-1], self.num_experts, self.proj_dim)
        latent = self.latent_dropout(latent)
        prior_logits = self.prior(g).float()
        if self.head_type == "moc":
            pi = torch.softmax(prior_logits, dim=-1).to(latent.dtype)
            mixed = (latent * pi.unsqueeze(-1)).sum(dim=2)
            return F.log_softmax(F.linear(mixed, weight, bias).float(), dim=-1)
        logits = F.linear(latent, weight, bias).float()                      # (B, T, K, V)
        log_prior = F.log_softmax(prior_logits, dim=-1).unsqueeze(-1)        # (B, T, K, 1)
        return torch.logsumexp(F.log_softmax(logits, dim=-1) + log_prior, dim=2)

    def forward(self, tokens, states=None):
        if states is None:
            states = self.zero_states(tokens.shape[0])
        x = self.input_dropout(self.embed(tokens))
        new_states = []
        raw = x
        for i, rnn in enumerate(self.rnns):
            raw, state = rnn(x, states[i])
            new_states.append(state)
            x = self.hidden_dropouts[i](raw) if i < self.num_layers - 1 else raw
        g = self.output_dropout(raw)
        log_probs = self.head(g)
        extra = log_probs.new_zeros(())
        if self.training:
            if self.alpha:
                extra = extra + self.alpha * g.float().pow(2).mean()
            if self.beta:
                extra = extra + self.beta * (raw[:, 1:] - raw[:, :-1]).float().pow(2).mean()
        return log_probs, new_states, extra

    # ---- weights by role (the Keras model's layout) ----------------------------------------
    def _role_params(self):
        """role -> (parameter, transpose?) in the Keras layout."""
        roles = {"embedding": (self.encoder.weight, False),
                 "output_bias": (self.decoder_bias, False)}
        for i, rnn in enumerate(self.rnns):
            roles[f"lstm{i}.kernel"] = (rnn.weight_ih, True)
            roles[f"lstm{i}.recurrent_kernel"] = (rnn.weight_hh, True)
            roles[f"lstm{i}.bias"] = (rnn.bias_ih, False)
        if self.head_type != "softmax":
            roles["head.latent_kernel"] = (self.latent.weight, True)
            roles["head.latent_bias"] = (self.latent.bias, False)
            roles["head.prior_kernel"] = (self.prior.weight, True)
        return roles

    @torch.no_grad()
    def load_roles(self, arrays):
        """Copy weights given by role (Keras layout, numpy arrays) into this model."""
        roles = self._role_params()
        missing = sorted(set(roles) - set(arrays))
        extra = sorted(set(arrays) - set(roles))
        if missing or extra:
            raise ValueError(f"weights by role do not match the native model: missing "
                             f"{missing}, unexpected {extra}.")
        for role, (param, transpose) in roles.items():
            value = torch.as_tensor(arrays[role], dtype=param.dtype)
            if transpose:
                value = value.t()
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"{role}: shape {tuple(value.shape)} does not fit "
                                 f"{tuple(param.shape)}.")
            param.copy_(value)

    @torch.no_grad()
    def export_roles(self):
        """The weights by role in the Keras layout, as float32 numpy arrays."""
        out = {}
        for role, (param, transpose) in self._role_params().items():
            value = param.detach().float().cpu()
            out[role] = (value.t() if transpose else value).contiguous().numpy()
        return out


def from_model_config(model_cfg, vocab_size, seed=None):
    """A `NativeAWDLSTM` from a preset's `model` part (the `zoo.AWDLSTM` arguments), or a
    `tools.frameworks.torch_zaremba.NativeZaremba` for `"kind": "zaremba"`."""
    if model_cfg.get("kind", "awd_lstm") == "zaremba":
        return from_zaremba_config(model_cfg, vocab_size, seed=seed)
    cfg = dict(model_cfg)
    cfg.pop("kind", None)
    head = cfg.pop("head", "softmax")
    head_kwargs = {}
    if isinstance(head, dict):
        head = dict(head)
        name = head.pop("type", "softmax")
        if "num_experts" in head:
            head_kwargs["num_experts"] = head.pop("num_experts")
        if "latent_dropout" in head:
            head_kwargs["latent_dropout"] = head.pop("latent_dropout")
        head.pop("seed", None)
        if head:
            raise ValueError(f"NativeAWDLSTM: unsupported head options {sorted(head)}.")
        head = name
    elif str(head).lower() in ("mos", "moc"):
        head_kwargs["num_experts"] = 15
    keys = ("embed_dim", "hidden_dim", "num_layers", "last_dim", "tie_weights", "dropout",
            "dropout_h", "dropout_i", "dropout_e", "weight_dropout", "alpha", "beta")
    kwargs = {k: cfg[k] for k in keys if k in cfg}
    return NativeAWDLSTM(vocab_size, head=head, seed=seed, **kwargs, **head_kwargs)


def _carried(states, batch_size):
    """The carried LSTM states, or None (start from zero) when the batch size changed."""
    if states is not None and states[0][0].shape[0] != batch_size:
        return None
    return states


class NativeTrainer:
    """The AWD-LSTM training step and evaluation around a `NativeAWDLSTM`.

    step: loss = NLL mean + AR + TAR; backward; clip_grad_norm_(clip); SGD step with
    lr * T / bptt and L2 weight_decay (torch.optim.SGD). The state is carried (detached).
    `loss_reduction="sum_over_time"` trains on the NLL summed over time and averaged over
    the streams, `scale_by_window=False` keeps lr for every window (TensorFlow's PTB
    tutorial, `zoo.ZarembaLSTM`).
    """

    def __init__(self, model, lr, bptt, clip_norm=0.25, weight_decay=0.0, autocast_dtype=None,
                 loss_reduction="token_mean", scale_by_window=True):
        self.loss_reduction, self.scale_by_window = loss_reduction, bool(scale_by_window)
        self.model = model
        self.lr, self.bptt = float(lr), int(bptt)
        self.clip_norm = clip_norm
        self.optimizer = torch.optim.SGD(model.parameters(), lr=self.lr,
                                         weight_decay=float(weight_decay))
        self.autocast_dtype = autocast_dtype
        self.train_states = None
        self.eval_states = None
        self.forward = model

    def _autocast(self, device):
        if self.autocast_dtype is None:
            return torch.autocast(device.type, enabled=False)
        return torch.autocast(device.type, dtype=self.autocast_dtype)

    def reset(self, which="all"):
        if which in ("all", "train"):
            self.train_states = None
        if which in ("all", "eval"):
            self.eval_states = None

    def train_step(self, x, y):
        """One window; returns (loss, nll) as 0-d tensors (not synchronized)."""
        model = self.model
        model.train()
        states = _carried(self.train_states, x.shape[0])
        with self._autocast(x.device):
            log_probs, new_states, extra = self.forward(x, states)
        nll = F.nll_loss(log_probs.reshape(-1, log_probs.shape[-1]), y.reshape(-1))
        loss = nll + extra
        if self.loss_reduction == "sum_over_time":  # sum_t mean_b NLL = T * token mean
            loss = nll * x.shape[1] + extra
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip_norm:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                           self.clip_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * (x.shape[1] / self.bptt if self.scale_by_window else 1.0)
        self.optimizer.step()
        self.train_states = [(h.detach(), c.detach()) for h, c in new_states]
        return loss.detach(), nll.detach()

    @torch.no_grad()
    def eval_step(self, x, y):
        """Summed NLL over the window (carrying the evaluation state)."""
        model = self.model
        model.eval()
        states = _carried(self.eval_states, x.shape[0])
        with self._autocast(x.device):
            log_probs, new_states, _ = self.forward(x, states)
        self.eval_states = new_states
        return F.nll_loss(log_probs.reshape(-1, log_probs.shape[-1]), y.reshape(-1),
                          reduction="sum")
