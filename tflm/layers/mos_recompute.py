"""The MoS mixture with a recomputing gradient: training memory of a few (B, T, V) tensors.

Autodiff of the mixture keeps every component's (B, T, V) logits and softmax for the
backward pass, O(B*T*K*V) floats: 3.3 (batched) to 4.4 (sequential) B*T*K*V tensors per
training step at the MoS PTB head size (bench/heads/results/mos_memory.md). Here the forward pass
keeps only its output log P, and the backward pass recomputes one component at a time from
its (B, T, L) latent.

    log P = logsumexp_k a_k,   a_k = log pi_k + log_softmax(l_k),   l_k = project(h_k)

Given g = dLoss / d log P and the posterior of component k for each word,
r_k = exp(a_k - log P) (sum_k r_k = 1), per context:

    dLoss / d log pi_k = sum_w u_{k,w},         u_k = g * r_k
    dLoss / d l_k      = u_k - softmax(l_k) sum_w u_{k,w}

and the projection's vector-Jacobian product with dLoss / d l_k gives the latent's and the
decoder weights' gradients. The projection runs twice per component in a training step
(forward, and once more in the backward pass, which takes its VJP from that run). Each
component waits for the previous one (`tflm.backends.ordering.after`): a TensorFlow graph
would otherwise run the K independent projections at once.

Yang et al. 2018 (ICLR), "Breaking the Softmax Bottleneck", §2.4 (the mixture); the
gradient is the mixture's chain rule written out.
"""

import keras
from keras import ops

from tflm.backends import autodiff
from tflm.backends.ordering import after


def _read(variable):
    # A Keras variable read into a tensor: the custom gradient's inputs must be tensors
    # (tf.custom_gradient refuses variables read inside the function).
    return ops.copy(variable) if isinstance(variable, keras.Variable) \
        else ops.convert_to_tensor(variable)


def recomputed_mixture_log_probs(project, variables, h, log_prior):
    """log sum_k pi_k softmax(project(h_k)), with the recomputing gradient above.

    Args:
        project: callable (B, T, L) latent -> (B, T, V) logits; it may read only
            `variables` among Keras variables (they are substituted by tensors here).
        variables: the float Keras variables `project` reads (its decoder weights).
        h: `(batch, time, K, L)` latents.
        log_prior: `(batch, time, K)` log mixture weights.

    Returns:
        `(batch, time, V)` float32 log-probabilities; their gradient reaches `h`,
        `log_prior` and `variables`.
    """
    variables = list(variables)
    num_components = h.shape[2]

    def logits(h_k, values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return ops.cast(project(h_k), "float32")

    @ops.custom_gradient
    def mixture(h, log_prior, *values):
        values = list(values)
        prior = ops.cast(log_prior, "float32")
        total = None
        for k in range(num_components):
            h_k = h[:, :, k] if total is None else after(h[:, :, k], [total])
            l_k = logits(h_k, values)
            term = l_k + (prior[..., k:k + 1] - ops.logsumexp(l_k, axis=-1, keepdims=True))
            total = term if total is None else ops.logaddexp(total, term)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            g = ops.cast(upstream, "float32")
            d_h, d_prior = [], []
            d_values = [ops.zeros_like(v) for v in values]
            for k in range(num_components):
                h_k = h[:, :, k] if k == 0 else after(h[:, :, k], [d_h[-1]] + d_values)
                (l_k,), pullback = autodiff.value_and_pullback(
                    lambda p: [logits(p[0], p[1:])], [h_k] + values)
                log_softmax = l_k - ops.logsumexp(l_k, axis=-1, keepdims=True)
                u_k = g * ops.exp(log_softmax + prior[..., k:k + 1] - total)
                u_sum = ops.sum(u_k, axis=-1, keepdims=True)
                grads = pullback([u_k - ops.exp(log_softmax) * u_sum])
                d_h.append(grads[0])
                d_prior.append(u_sum[..., 0])
                d_values = [a + ops.cast(b, a.dtype) for a, b in zip(d_values, grads[1:])]
            return (ops.cast(ops.stack(d_h, axis=2), h.dtype),
                    ops.cast(ops.stack(d_prior, axis=-1), log_prior.dtype), *d_values)

        return total, grad

    return mixture(h, log_prior, *[_read(v) for v in variables])
