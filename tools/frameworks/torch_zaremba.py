"""The native PyTorch peer of a `zoo.ZarembaLSTM` preset (`model.kind` "zaremba").

`NativeZaremba` is TensorFlow's PTB-tutorial model in plain PyTorch (one `nn.LSTM` per layer
with b_hh fixed at zero, ordinary dropout on the embedded input and every layer's output, a
softmax or Zhang 2018's MoS head, untied / tied / factorized decoder), with the interface
`tools.frameworks.native_runner` drives (`forward(tokens, states) -> (log_probs, states,
extra)`, weights by role as `tools.frameworks.roles` names them). `NativeTrainer` runs it
with `loss_reduction="sum_over_time"` and no T / bptt scaling: the tutorial's step.
"""

import torch
import torch.nn.functional as F
from torch import nn


class NativeZaremba(nn.Module):
    """Args: vocab_size, hidden_dim, num_layers, dropout, tie_weights, output_bias (tied),
    head ("softmax" or "mos"), num_experts, prior_bias, output_rank (as `zoo.ZarembaLSTM`)."""

    def __init__(self, vocab_size, hidden_dim=200, num_layers=2, dropout=0.0,
                 tie_weights=False, output_bias=True, head="softmax", num_experts=15,
                 prior_bias=True, output_rank=None, seed=None):
        super().__init__()
        if head not in ("softmax", "mos"):
            raise ValueError(f"NativeZaremba supports the softmax and mos heads; got {head!r}.")
        if output_rank and tie_weights:
            raise ValueError("output_rank factorizes an untied decoder.")
        h = int(hidden_dim)
        self.hidden, self.num_layers, self.dropout = h, int(num_layers), float(dropout)
        self.head_type, self.num_experts = head, int(num_experts)
        self.tie_weights, self.output_rank = bool(tie_weights), output_rank
        self.encoder = nn.Embedding(vocab_size, h)
        self.rnns = nn.ModuleList([nn.LSTM(h, h, 1, batch_first=True)
                                   for _ in range(self.num_layers)])
        for rnn in self.rnns:  # one trained bias, as the tutorial's cells
            rnn.bias_hh_l0.requires_grad_(False).zero_()
        if head == "mos":
            self.latent = nn.Linear(h, self.num_experts * h)
            self.prior = nn.Linear(h, self.num_experts, bias=bool(prior_bias))
        if self.tie_weights:
            self.decoder_weight = None
        elif output_rank:
            self.output_factor = nn.Parameter(torch.zeros(vocab_size, int(output_rank)))
            self.input_factor = nn.Parameter(torch.zeros(int(output_rank), h))
        else:
            self.decoder_weight = nn.Parameter(torch.zeros(vocab_size, h))
        self.decoder_bias = (nn.Parameter(torch.zeros(vocab_size))
                             if not self.tie_weights or output_bias else None)
        self.set_seed(seed)

    def set_seed(self, seed):
        if seed is not None:
            torch.manual_seed(int(seed))

    def zero_states(self, batch):
        w = self.encoder.weight
        return [(w.new_zeros(1, batch, self.hidden), w.new_zeros(1, batch, self.hidden))
                for _ in range(self.num_layers)]

    def _decode(self, x):
        if self.tie_weights:
            return F.linear(x, self.encoder.weight, self.decoder_bias)
        if self.output_rank:
            return F.linear(F.linear(x, self.input_factor), self.output_factor,
                            self.decoder_bias)
        return F.linear(x, self.decoder_weight, self.decoder_bias)

    def forward(self, tokens, states=None):
        if states is None:
            states = self.zero_states(tokens.shape[0])
        x = F.dropout(self.encoder(tokens), self.dropout, self.training)
        new_states = []
        for rnn, state in zip(self.rnns, states):
            x, new = rnn(x, state)
            new_states.append(new)
            x = F.dropout(x, self.dropout, self.training)
        if self.head_type == "softmax":
            log_probs = F.log_softmax(self._decode(x).float(), -1)
        else:
            b, t, _ = x.shape
            latent = torch.tanh(self.latent(x)).view(b, t, self.num_experts, self.hidden)
            log_prior = F.log_softmax(self.prior(x).float(), -1).unsqueeze(-1)
            log_probs = torch.logsumexp(F.log_softmax(self._decode(latent).float(), -1)
                                        + log_prior, dim=2)
        return log_probs, new_states, log_probs.new_zeros(())

    def _role_params(self):
        roles = {"embedding": (self.encoder.weight, False)}
        for i, rnn in enumerate(self.rnns):
            roles[f"lstm{i}.kernel"] = (rnn.weight_ih_l0, True)
            roles[f"lstm{i}.recurrent_kernel"] = (rnn.weight_hh_l0, True)
            roles[f"lstm{i}.bias"] = (rnn.bias_ih_l0, False)
        if self.head_type == "mos":
            roles["head.latent_kernel"] = (self.latent.weight, True)
            roles["head.latent_bias"] = (self.latent.bias, False)
            roles["head.prior_kernel"] = (self.prior.weight, True)
            if self.prior.bias is not None:
                roles["head.prior_bias"] = (self.prior.bias, False)
        if self.tie_weights:
            if self.decoder_bias is not None:
                roles["output_bias"] = (self.decoder_bias, False)
        else:
            roles["head.bias"] = (self.decoder_bias, False)
            if self.output_rank:
                roles["head.output_factor"] = (self.output_factor, False)
                roles["head.input_factor"] = (self.input_factor, False)
            else:
                roles["head.kernel"] = (self.decoder_weight, True)
        return roles

    @torch.no_grad()
    def load_roles(self, arrays):
        roles = self._role_params()
        missing, extra = sorted(set(roles) - set(arrays)), sorted(set(arrays) - set(roles))
        if missing or extra:
            raise ValueError(f"weights by role do not match the native Zaremba model: "
                             f"missing {missing}, unexpected {extra}.")
        for role, (param, transpose) in roles.items():
            value = torch.as_tensor(arrays[role], dtype=param.dtype)
            param.copy_(value.t() if transpose else value)

    @torch.no_grad()
    def export_roles(self):
        return {role: (p.detach().float().cpu().t() if t else p.detach().float().cpu())
                .contiguous().numpy() for role, (p, t) in self._role_params().items()}


def from_zaremba_config(model_cfg, vocab_size, seed=None):
    """A `NativeZaremba` from a preset's `model` part (the `zoo.ZarembaLSTM` arguments)."""
    cfg = dict(model_cfg)
    cfg.pop("kind", None)
    head = cfg.pop("head", "softmax")
    head = {"type": head} if isinstance(head, str) else dict(head)
    kwargs = {"head": head.pop("type", "softmax")}
    for key in ("num_experts", "prior_bias", "output_rank"):
        if key in head:
            kwargs[key] = head.pop(key)
    if head:
        raise ValueError(f"NativeZaremba: unsupported head options {sorted(head)}.")
    for key in ("hidden_dim", "num_layers", "dropout", "tie_weights", "output_bias"):
        if key in cfg:
            kwargs[key] = cfg.pop(key)
    cfg.pop("init_scale", None)  # the weights come from the shared start
    cfg.pop("use_cudnn", None)
    cfg.pop("seed", None)
    if cfg:
        raise ValueError(f"NativeZaremba: unsupported model options {sorted(cfg)}.")
    return NativeZaremba(vocab_size, seed=seed, **kwargs)
