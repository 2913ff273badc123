"""Run salesforce/awd-lstm-lm's own `main.py` from a checkout on current PyTorch, with the two
documented shims and nothing else changed:

    python bench/reproductions/reference_launcher.py CHECKOUT [main.py's flags ...]

1. Weight drop in evaluation mode (the reference's issue #79, on every PyTorch since 1.0):
   `WeightDrop._setweights` hands the LSTM `dropout(raw, training=False)`, which is the raw
   `Parameter` itself, so the LSTM registers it as a parameter and the next training step's
   plain tensor is refused ("cannot assign ... as parameter"). The shim gives evaluation a
   plain tensor (`raw.detach()`); training is the reference's own line: `dropout(raw, p)`,
   through which the gradient reaches the raw weight. main.py never sets `variational`.
2. `torch.load` of the reference's own pickles (its corpus cache and the `[model, criterion,
   optimizer]` it saves and reloads for the test pass): PyTorch 2.6 made `weights_only=True`
   the default, which refuses them; the shim passes `weights_only=False` as earlier
   releases did.

The process runs from the caller's working folder (main.py writes its corpus cache and
model there), with the checkout first on `sys.path` so its `data`, `model`, `utils`,
`splitcross` and `weight_drop` modules are the ones imported.
"""

import functools
import pathlib
import runpy
import sys


def apply_shims():
    import torch
    import weight_drop  # the checkout's module

    def set_weights(self):
        if self.variational:
            raise NotImplementedError("the launcher's shim covers main.py's WeightDrop "
                                      "(variational=False) only")
        for name in self.weights:
            raw = getattr(self.module, name + "_raw")
            weight = (torch.nn.functional.dropout(raw, p=self.dropout, training=True)
                      if self.training else raw.detach())
            setattr(self.module, name, weight)

    weight_drop.WeightDrop._setweights = set_weights
    torch.load = functools.partial(torch.load, weights_only=False)


def main(argv):
    checkout = pathlib.Path(argv[0]).resolve()
    if not (checkout / "main.py").is_file():
        raise SystemExit(f"{checkout}: not a salesforce/awd-lstm-lm checkout (no main.py)")
    sys.path.insert(0, str(checkout))
    apply_shims()
    sys.argv = [str(checkout / "main.py"), *argv[1:]]
    runpy.run_path(str(checkout / "main.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
