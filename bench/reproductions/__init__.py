"""Shortened reproductions of published results on this machine: the presets' runs next
to the papers' figures, and zoo.train side by side with the reference's PyTorch loop."""
