"""Benchmarks, grouped by what they measure; each script runs as a module from the
repository root (`python -m bench.training.lstm_loop`) and rewrites its results file in the
`results/` folder beside it (`bench.harness.publish`). bench/README.md is the index."""
