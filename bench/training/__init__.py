"""Benchmarks of training: speed against the published code, on a GPU, of the LSTM loop,
of fit's callbacks and data pipeline, across replicas, per backend."""
