"""Why the conditional CNF head (ccnf) learns so little: probes on a trained zoo run.

    python bench/repro_flow_heads_probe.py RUN_DIR [--contexts 64] [--draws 32]

RUN_DIR is a zoo.train run with a `ccnf` head (e.g. `/tmp/flow_repro/ccnf_full` of
bench/repro_flow_heads.py). On `--contexts` test contexts (the first windows of the test
split, no dropout) it prints:

1. the sampler's proposal against the training unigram (is Q the unigram?);
2. the flow weights: |W_out|, |b_out|, and c_j = sum_i W_z[i, j] W_out[j, i] (the
   Jacobian's trace weights);
3. Delta_w(h) (exact trace): its spread over words, over contexts for a fixed word (the
   context-dependent part, the only part that can raise the rank), next to the logits';
4. the gradient of the flow parameters: the full-softmax objective -log P(y | c) (exact
   trace) against the importance-sampled objective -log P(Y = 0 | S, c) averaged over
   `--draws` draws of the 20 noise words and Hutchinson's noise (as in training), their
   cosine and norm ratio; and the norm of the gradient of every other trainable weight,
   i.e. the share of the flow in a step clipped to a global norm of 0.25;
5. the same comparison for the head's weights alone over `--repeats` draws made at once
   (the contexts repeated; each copy its own noise), and the full-vocabulary objective with
   Hutchinson's trace against the exact one (Jensen: Delta enters a softmax).
"""

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--contexts", type=int, default=64, help="test positions (batch 1 x T)")
    p.add_argument("--draws", type=int, default=32)
    p.add_argument("--repeats", type=int, default=256, help="draws of part 5 (batched)")
    args = p.parse_args(argv)

    import numpy as np
    import tensorflow as tf
    from keras import ops

    import zoo
    from zoo.corpora import load_data
    from tflm.losses import importance_sampled_log_probs

    run = pathlib.Path(args.run)
    config = json.loads((run / "config.json").read_text())
    corpus, _ = load_data(config["corpus"])
    model = zoo.load_model(run / "best.keras")
    head = model.head
    V = head.vocab_size

    counts = np.bincount(np.asarray(corpus.train), minlength=V).astype(float)
    q = head.sampler.proposal()
    unigram = counts / counts.sum()
    print(f"1. proposal: max |Q - unigram| = {np.abs(q - unigram).max():.2e} "
          f"(uniform would be {1 / V:.2e} everywhere; Q max {q.max():.3g})")

    w = {v.name: np.asarray(v.numpy()) for v in head.flow_params()}
    c = np.sum(w["w_z"] * w["w_out"].T, axis=0)
    print(f"2. |W_z| = {np.linalg.norm(w['w_z']):.3g}, |W_out| = {np.linalg.norm(w['w_out']):.3g}, "
          f"|b_out| = {np.linalg.norm(w['b_out']):.3g}, |W_h| = "
          f"{np.linalg.norm(head.w_h.numpy()):.3g}; c = diag(W_z W_out): |c| = "
          f"{np.linalg.norm(c):.3g}, sum c = {c.sum():.3g}")

    test = np.asarray(corpus.test)
    T = args.contexts
    x = test[None, :T].astype("int32")
    y = test[None, 1:T + 1].astype("int32")
    out = model.backbone(ops.convert_to_tensor(x), training=False)
    h = out["sequence_output"]
    all_ids = head._all_words(h, 0, V)
    logits = np.asarray(head.candidate_logits(h, all_ids))[0]
    density, _ = head.flowed_log_density(h, all_ids, training=False)
    delta = logits - np.asarray(density)[0]                      # (T, V)
    centred = delta - delta.mean(axis=1, keepdims=True)          # a per-context constant cancels
    word_part = centred.mean(axis=0)                             # context-free word bias
    context_part = centred - word_part
    lc = logits - logits.mean(axis=1, keepdims=True)
    print(f"3. Delta over {T} contexts x {V} words: mean {delta.mean():.3g}; std over words "
          f"(per context, mean) {centred.std(axis=1).mean():.3g}; context-free part std "
          f"{word_part.std():.3g}; context-dependent part std {context_part.std():.3g} "
          f"(max |.| {np.abs(context_part).max():.3g}); logits' std over words "
          f"{lc.std(axis=1).mean():.3g}")
    s = np.linalg.svd(context_part, compute_uv=False)
    print(f"   context-dependent part of Delta: singular values / s_1 of logits-part "
          f"{s[:5] / np.linalg.svd(lc, compute_uv=False)[0]}")

    flow_vars = head.flow_params() + [head.w_h, head.b_h]
    other = [v for v in model.trainable_variables if all(v is not f for f in flow_vars)]
    yt = ops.convert_to_tensor(y)

    def full_loss():
        hh = model.backbone(ops.convert_to_tensor(x), training=False)["sequence_output"]
        lp = head(hh, training=False)
        return -tf.reduce_mean(tf.gather(lp, yt, batch_dims=2))

    def sampled_loss():
        hh = model.backbone(ops.convert_to_tensor(x), training=False)["sequence_output"]
        ids, log_q = head.sampler(yt)
        dens, _ = head.flowed_log_density(hh, ids, training=True)
        return -tf.reduce_mean(importance_sampled_log_probs(dens, log_q)[..., 0])

    def grads(fn):
        with tf.GradientTape() as tape:
            loss = fn()
        g = tape.gradient(loss, flow_vars + other)
        return [np.zeros(v.shape) if gi is None else np.asarray(tf.convert_to_tensor(gi)) for gi, v in
                zip(g, flow_vars + other)]

    full = grads(full_loss)
    names = [v.name for v in flow_vars]
    trained_trace = head.trace
    for trace in ("hutchinson", "exact"):
        head.trace = trace
        draws = [grads(sampled_loss) for _ in range(args.draws)]
        mean = [np.mean([d[i] for d in draws], axis=0) for i in range(len(full))]
        print(f"4. gradients: full softmax (exact trace) vs the mean of {args.draws} draws of "
              f"the sampled objective with the {trace} trace in training:")
        print("   var        |full|     |mean sampled|  cos(full, mean)  |one draw| (median)  "
              "cos(full, one draw) (median)")
        for i, name in enumerate(names):
            a, b = full[i].ravel(), mean[i].ravel()
            cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
            one = np.median([np.linalg.norm(d[i]) for d in draws])
            cos1 = np.median([a @ d[i].ravel() / (np.linalg.norm(a) * np.linalg.norm(d[i])
                                                  + 1e-30) for d in draws])
            print(f"   {name:10s} {np.linalg.norm(a):.3e}  {np.linalg.norm(b):.3e}      "
                  f"{cos:+.3f}           {one:.3e}           {cos1:+.3f}")
    head.trace = trained_trace
    n_flow = np.sqrt(sum(np.sum(g ** 2) for g in full[:len(flow_vars)]))
    n_other = np.sqrt(sum(np.sum(g ** 2) for g in full[len(flow_vars):]))
    print(f"   full-objective gradient norm: flow + W_h {n_flow:.3e}, the rest "
          f"({len(other)} weights) {n_other:.3e}; flow share of a step clipped to 0.25: "
          f"{n_flow / max(n_flow, n_other, 1e-30):.3g} x")

    # 5. Many draws at once: R copies of the contexts (every copy its own noise words and
    # Hutchinson noise), the head alone (h fixed): the mean over R draws of the gradient,
    # for the sampled objective and for the full vocabulary with the training trace.
    hh = ops.convert_to_tensor(np.asarray(h))
    head_vars = flow_vars
    hs = tf.repeat(hh, args.repeats, axis=0)
    ys = tf.repeat(yt, args.repeats, axis=0)

    def head_grads(fn):
        with tf.GradientTape() as tape:
            loss = fn()
        return np.concatenate([np.ravel(g) for g in tape.gradient(loss, head_vars)]), float(loss)

    exact, exact_loss = head_grads(
        lambda: -tf.reduce_mean(tf.gather(head(hh, training=False), yt, batch_dims=2)))
    print(f"5. head weights only, mean over {args.repeats} draws (batched):")
    for trace in ("hutchinson", "exact"):
        head.trace = trace
        g, _ = head_grads(lambda: -tf.reduce_mean(head(hs, training=True, targets=ys)[..., 0]))
        print(f"   sampled objective, {trace:10s} trace: cos(exact, mean) "
              f"{g @ exact / (np.linalg.norm(g) * np.linalg.norm(exact)):+.3f}, "
              f"|mean - exact| / |exact| {np.linalg.norm(g - exact) / np.linalg.norm(exact):.3g}")
        if trace == "hutchinson":
            reps = max(1, args.repeats // 8)
            hv, yv = hs[:reps], ys[:reps]
            g, loss = head_grads(lambda: -tf.reduce_mean(tf.gather(head(hv, training=True), yv,
                                                                   batch_dims=2)))
            print(f"   full vocabulary, hutchinson trace ({reps} draws): cos(exact, mean) "
                  f"{g @ exact / (np.linalg.norm(g) * np.linalg.norm(exact)):+.3f}, "
                  f"|mean - exact| / |exact| {np.linalg.norm(g - exact) / np.linalg.norm(exact):.3g}"
                  f"; mean loss {loss:.6f} vs exact {exact_loss:.6f}")
    head.trace = trained_trace


if __name__ == "__main__":
    main()
