"""Benchmarks of what runs after training: exporting Q_theta, its exact singular values
(CPU and GPU, up to the full WikiText-2 test matrix), dynamic evaluation."""
