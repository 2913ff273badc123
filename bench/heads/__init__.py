"""Benchmarks of the output layers: each head's step time and memory, the ODE heads, sampled
softmax, the MoS mixture's memory, and the embedding / output regularizers."""
