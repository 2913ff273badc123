"""Keras on PyTorch with `jit_compile=True`: the train step's forward pass and loss as one
`torch.compile`d graph, the rest of the step eager.

Keras' own `jit_compile=True` on PyTorch compiles the whole train step
(`torch.compile(one_step_on_data)`). Its graph breaks at `loss.backward()`, at every
dropout mask (Keras' PyTorch seed generator is `torch.compiler.disable`d), at host reads
and at Keras' layer bookkeeping: at 8 / 8 wide, batch 8, bptt 8 on a 2-core CPU, 32
graphs, 75 s of compiling and 28.7 ms a step against 7.3 ms eagerly
(`bench/training/results/step_profile.md`). tflm compiles the part that is one graph:

    loss, nll_sum, tokens = model.compute_lm_loss(y, model(x, training=True, targets=y))

AOTAutograd compiles its backward with it, so `loss.backward()` runs one compiled
backward; the gradients' processing, the optimizer's update and the metrics stay eager (a
few multi-tensor kernels each). Evaluation and prediction run eagerly.

What keeps the forward one graph:

- the losses the model added in the previous step (`add_loss`: AR, TAR) are dropped before
  the call, as Keras' outermost call drops them on entry; left to that call, dynamo guards
  on the previous step's loss tensors and recompiles at every step;
- the training streams' state exists before the call (zeros at a pass's start:
  `EagerStreamState.ensure`), so the first window of a pass is no graph of its own;
- layers are called through `layer.call` where that is the same
  (`tflm.backends.torch_layer_calls`), where `Layer.__call__` binds a `CallSpec`
  (`inspect.Signature.bind`), which dynamo cannot trace;
- dropout masks are drawn in the graph from PyTorch's generator (`TorchBackend.uniform`),
  not from Keras' `SeedGenerator` streams: a compiled run's masks differ from an eager
  run's, and `keras.utils.set_random_seed` seeds both;
- the tokens are not concrete while traced (`TorchBackend.is_concrete`): a model with
  `padded_windows = False` (what `zoo.train` sets on PyTorch, whose windows are not
  padded) runs the mask-free fused LSTM, with `compat.torch_assert_async` in the graph failing
  a window that holds padding; otherwise the window keeps its mask (the masked LSTM loop);
- each LSTM layer's fused kernel (cuDNN, oneDNN) is one operator in the graph
  (`tflm.backends.torch_lstm_op`, its backward a recomputation), where PyTorch's
  decomposition of `torch.lstm` would unroll the time loop: at the AWD-LSTM preset's bptt
  of 70 that step was slower than the eager one.

Window lengths: the targets are picked with `torch.gather` (`TorchBackend.pick_targets`)
and nothing else in the forward fixes the window's length, so torch.compile's automatic
dynamic shapes compile the first window of a new length as a graph with a symbolic time
axis that serves every later length: two graphs in all. Dynamo keeps one cache for
`forward_and_loss`: past its recompile limit (`recompile_limit` in dynamo's config,
models and shapes together) the forward runs eagerly, with dynamo's warning.

Measured on the 2-core CPU (`python -m bench.training.step_profile --preset awd_lstm_ptb
--backends torch --device cpu --set training.jit_compile=true`, against `false`;
`bench/training/results/step_profile.md`): at 8 / 8 wide with the preset's batch 20 and
bptt 70 on one thread, where a step is mostly the host's work, 0.83-1.02x the eager
step's time (four pairs; 1,109 ops a step against 1,401-1,417, the host's share half the
eager one's); at 200 / 400 x 3, bptt 35, two threads, where a step is
arithmetic, it is slower (191.07 against 161.99 ms: the LSTMs' recomputed forward). The
GPU's figures: `bench.gpu_session`'s `torch-compile` stage.
"""

import torch

from tflm import compat

# torch.compile's backend for the forward pass; the tests use dynamo's "eager" and
# "aot_eager" (the same capture, without Inductor's code generation).
BACKEND = "inductor"

_COMPILED = {}  # backend -> the compiled `forward_and_loss`


def forward_and_loss(model, x, y, sample_weight):
    """`(loss, nll_sum, tokens)` of a training window: the eager train step's forward."""
    log_probs = model(x, training=True, targets=y)
    return model.compute_lm_loss(y, log_probs, sample_weight, inputs=x, training=True)


def compiled_forward_and_loss(model, x, y, sample_weight):
    """`forward_and_loss`, compiled (made on first use with `BACKEND`)."""
    if BACKEND not in _COMPILED:
        _COMPILED[BACKEND] = torch.compile(forward_and_loss, backend=BACKEND)
    compat.keras_clear_losses(model)
    model.stream_state(True).ensure(x.shape[0])
    return _COMPILED[BACKEND](model, x, y, sample_weight)
