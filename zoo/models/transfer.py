"""Starting a model from a pre-trained base whose output head differs.

Andonov 2019 (§7.3) puts a new output layer (a NeuralODE on the logits, a flow) on top of a
pre-trained AWD-LSTM: the base's weights are copied (`--init-from BASE.keras`), the new
layer starts at its initialisation, and the "freeze" rows of Tables 7.3-7.10 train only the
new layer. Here:

- `transfer_weights(src, model)`: the backbone whole (same architecture, else an error);
  the head whole when both heads are of one class, into the new head's `base` when the new
  head is a flow on a base head of the source's class (`tflm.layers.CNFHead` on MoS or
  DOC), else every head variable of the source
  by its name inside the head (the vocabulary projection `kernel` / `bias` of an untied
  head), which the new head must hold with the same shape. The source's head may not lose a
  variable; the new head's other variables keep their initialisation and are listed.

Freezing is the model's own option (`model.freeze_base`, `zoo.AWDLSTM(freeze_base=True)`),
saved in its configuration, so a reloaded or resumed model trains the same weights.
"""

from zoo.errors import UserError


def _relative_name(variable, layer):
    prefix = layer.path + "/"
    path = variable.path
    return path[len(prefix):] if path.startswith(prefix) else variable.name


def transfer_weights(src, model, source_name="the source model"):
    """Copy `src`'s weights into `model` (see the module docstring); `source_name` names
    `src` in error messages. Unbuilt models are built first.

    Returns:
        list of the `model` variable paths that kept their initialisation (empty when the
        two models have the same structure).
    """
    for m in (src, model):
        if not m.built:
            m.build()
    src_w, dst_w = src.backbone.get_weights(), model.backbone.get_weights()
    if [w.shape for w in src_w] != [w.shape for w in dst_w]:
        raise UserError(
            f"{source_name}: its backbone (embedding, LSTM layers) differs from "
            "this configuration's: the shapes of its weights are "
            f"{[tuple(w.shape) for w in src_w]}, this model's {[tuple(w.shape) for w in dst_w]}. "
            "Set the model sizes to the base model's (e.g. --set model.hidden_dim=...).")
    model.backbone.set_weights(src_w)
    if type(src.head) is type(model.head):
        model.head.set_weights(src.head.get_weights())
        return []
    base = getattr(model.head, "base", None)  # a flow on a base head (CNFHead)
    if base is not None and type(base) is type(src.head):
        base.set_weights(src.head.get_weights())
        kept = {id(v) for v in base.variables}
        return sorted(v.path for v in model.head.variables if id(v) not in kept)
    dst = {_relative_name(v, model.head): v for v in model.head.variables}
    missing = []
    for v in src.head.variables:
        name = _relative_name(v, src.head)
        target = dst.pop(name, None)
        if target is None or tuple(target.shape) != tuple(v.shape):
            missing.append(f"{name} {tuple(v.shape)}")
            continue
        target.assign(v.value)
    if missing:
        raise UserError(
            f"{source_name}: its {type(src.head).__name__} head holds "
            f"{', '.join(missing)}, which this configuration's {type(model.head).__name__} "
            "head has no place for; start from a base with the same projection (tied or "
            "untied) or the same head.")
    return sorted(v.path for v in dst.values())
