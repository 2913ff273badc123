"""Analysis tools for trained language models (run after training).

Modules are imported on demand; nothing heavy is imported here.

- ``tools.qmatrix``: export Q_theta of a trained model, streamed to disk.
- ``tools.qmatrix_io``: open and validate a log-probability matrix Q_theta (``.npy``).
- ``tools.spectrum``: exact singular values (LAPACK, streamed TSQR, streamed Gram matrix
  with a stated error floor) and a labelled approximate randomized variant.
- ``tools.rank``: Press rank, numpy rank, epsilon-effective rank; ``python -m tools.rank``.
- ``tools.rank_thresholds``: the Press and numpy rank thresholds (what spectra and plots
  draw and check too).
- ``tools.plots``: singular value plots (thesis Figures 5.9-5.12, MoS App. C.1).
- ``tools.divergence``: expected pairwise KL between next-word distributions, top-k tables.
- ``tools.stats``: two-sided Wilcoxon rank-sum test over seeds.
- ``tools.noise_robustness``: Press-rank robustness experiments (thesis §5.5, §5.6).
- ``tools.bottleneck_demo``: the softmax bottleneck on a synthetic language.
- ``tools/compare_frameworks.py``: the entry point of the framework comparison
  (``python tools/compare_frameworks.py`` or ``python -m tools.compare_frameworks``),
  whose harness is the subpackage ``tools.frameworks``.
"""
