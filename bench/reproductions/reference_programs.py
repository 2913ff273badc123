"""Which published program a preset's reference is, and whether a checkout holds it:
salesforce/awd-lstm-lm's main.py for a softmax head, zihangdai/mos's for a mixture of
softmaxes. Apart from `reference_curves` (which imports Keras and PyTorch) so that a tool
can refuse a wrong checkout before it starts anything."""

import pathlib


def head_type(config):
    head = config["model"].get("head", "softmax")
    return head if isinstance(head, str) else head.get("type", "softmax")


def reference_program(config):
    """"salesforce" (salesforce/awd-lstm-lm's main.py: the softmax head) or "mos"
    (zihangdai/mos's main.py: the mixture of softmaxes), else `SystemExit`."""
    kind = {"softmax": "salesforce", "mos": "mos"}.get(head_type(config))
    if kind is None:
        raise SystemExit(f"head {head_type(config)!r}: this tool runs salesforce/awd-lstm-lm's "
                         "main.py (softmax) or zihangdai/mos's (mos) only")
    return kind


def check_checkout(checkout, program):
    """`SystemExit` unless `checkout` holds the main.py of `program`."""
    main = pathlib.Path(checkout) / "main.py"
    if not main.is_file():
        raise SystemExit(f"--reference {checkout}: no main.py there")
    if ("n_experts" in main.read_text(encoding="utf-8")) != (program == "mos"):
        want = {"salesforce": "salesforce/awd-lstm-lm", "mos": "zihangdai/mos"}[program]
        raise SystemExit(f"--reference {checkout}: this preset's reference is {want}'s "
                         "main.py; give a checkout of it")
