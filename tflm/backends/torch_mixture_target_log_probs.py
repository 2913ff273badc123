"""The targets' log-probabilities under a mixture of softmaxes, chunk by chunk (PyTorch).

    l_k = h_k W^T + b,   log P(y | c) = logsumexp_k( log pi_k + l_{k,y} - logsumexp_v l_{k,v} )

Over a whole window (`Backend.mixture_target_log_probs`) each component's logits are a
`(batch, time, K, V)` tensor, and autograd keeps them and the softmax of their log-sum-exp
for the backward pass: about five such tensors at the MoS PTB preset's head size, 2.5 GB
(`bench/heads/results/mos_targets_torch.md`). Here the window's rows (its batch x time
positions, flattened) run in chunks of `ROWS` under `torch.utils.checkpoint`: the forward
pass keeps no chunk's logits, and the backward pass recomputes one chunk's at a time and
backpropagates through it. So at most one chunk's `(ROWS, K, V)` tensors live at once, at
the price of a fourth GEMM (the logits twice), as the checkpointing library does for any
function; the gradients are autograd's of the same expression, for any cotangent.

PyTorch's own checkpointing (not a written backward pass as on JAX,
`tflm.backends.jax_mixture_target_log_probs`, which learns from the cotangent being
proportional to the positions' weights that it needs no recompute; in eager PyTorch that
test would read the device from the host): the recompute is the expression the
whole-window pick differentiates. Padded positions are computed like the others (the
train step weights them 0).

The recompute costs time: at the MoS PTB preset's head size (one `(batch, time, K, V)`
tensor 481 MB) the loss and its gradient took 3.78 s in chunks against 2.40 s for the
whole window on a 2-core CPU, with 513 against 2,467 MiB of memory
(`bench/heads/results/mos_targets_torch.md`). So `TorchBackend.mixture_target_log_probs`
runs chunks only past `WHOLE_WINDOW_ELEMENTS`.
"""

import torch
from torch.utils import checkpoint

from tflm.backends import torch_linear

# Up to this many elements in one (batch, time, K, V) tensor (1 GiB of float32, about five
# kept for the backward pass) the window is picked whole; past it (an MoS head over
# WikiText-2's 33,278 words at the PTB preset's batch and bptt: 1.6 GiB) chunk by chunk.
WHOLE_WINDOW_ELEMENTS = 2**28


def runs_in_chunks(h, weight):
    """Whether the pick of `h` `(batch, time, K, d)` under `weight` `(V, d)` runs in chunks."""
    batch, time, k, _ = h.shape
    return batch * time * k * weight.shape[0] > WHOLE_WINDOW_ELEMENTS


# Rows (batch x time positions) of one chunk: at K = 15, V = 10,000 a chunk's logits are
# 96 MB, large enough for efficient GEMMs on a CPU and a GPU.
ROWS = 160


def _chunk(h, log_prior, weight, bias, targets):
    """log P(y | c) of a chunk's rows: `h` (rows, K, d), `log_prior` (rows, K), `targets`
    (rows,) -> (rows,) float32."""
    logits = torch_linear.linear(h, weight, bias).float()  # the output layer's GEMMs
    picked = torch.gather(logits, -1, targets[:, None, None].expand(-1, logits.shape[1], 1))
    log_components = picked[..., 0] - torch.logsumexp(logits, -1)
    return torch.logsumexp(log_prior.float() + log_components, -1)


def mixture_target_log_probs(h, log_prior, weight, bias, targets):
    """log sum_k pi_k softmax(h_k W^T + b) at `targets`, `(batch, time)` float32: `h`
    `(batch, time, K, d)`, `log_prior` `(batch, time, K)`, `weight` `(V, d)`, `bias` `(V,)`
    or None, `targets` int `(batch, time)`."""
    batch, time, k, d = h.shape
    rows_h, rows_prior = h.reshape(-1, k, d), log_prior.reshape(-1, k)
    rows_targets = targets.reshape(-1).long()
    records = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (h, log_prior, weight, bias))
    pieces = []
    for start in range(0, rows_h.shape[0], ROWS):
        part = slice(start, start + ROWS)
        args = (rows_h[part], rows_prior[part], weight, bias, rows_targets[part])
        pieces.append(checkpoint.checkpoint(_chunk, *args, use_reentrant=False) if records
                      else _chunk(*args))
    return torch.cat(pieces).reshape(batch, time)
