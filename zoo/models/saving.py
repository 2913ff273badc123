"""Loading saved zoo models (`.keras` files).

`load_model` is Keras' loader with zoo's classes registered. `check_model_file` and
`load_model_file` are what the command lines use for a model file a user named: a missing
file, a folder, a truncated or corrupt file is a one-line `UserError` saying which
(Keras itself reports a truncated file as "File not found", and a bit-flipped one with
whatever its zip or HDF5 reader raised).
"""

import pathlib
import zipfile

import keras

from zoo.errors import UserError
from zoo.models.registry import register_all


def load_model(path, **kwargs):
    """`keras.saving.load_model` for models made with zoo: registers every model family's
    classes (and tflm's layers) with Keras first, which the cheap `import zoo` does not.
    Keyword arguments go to `keras.saving.load_model`."""
    register_all()
    return keras.saving.load_model(path, **kwargs)


def check_model_file(path, what="model file"):
    """Raise `UserError` unless `path` is a whole `.keras` file: it exists, is a file, and
    is a complete zip archive (a `.keras` file is one; a truncated copy is not). `what`
    names it in the message ("--init-from")."""
    path = pathlib.Path(path)
    if path.is_dir():
        hint = ("; pass its best.keras (or final.keras)" if (path / "best.keras").exists()
                else "; name a .keras file")
        raise UserError(f"{what} {path} is a folder, not a .keras model file{hint}.")
    if not path.exists():
        raise UserError(f"{what} {path}: no such file.")
    if path.suffix != ".keras":
        raise UserError(f"{what} {path} is not a .keras model file (a zoo model is saved as "
                        "NAME.keras).")
    try:
        whole = zipfile.is_zipfile(path)
    except OSError as err:
        raise UserError(f"{what} {path} cannot be read ({err.strerror or err}).") from err
    if not whole:
        raise UserError(f"{what} {path} is unreadable as a Keras model (truncated or corrupt: "
                        f"not a complete .keras zip archive, {path.stat().st_size:,} bytes); "
                        "use another copy, e.g. the run's checkpoint/model.keras or "
                        "final.keras.")


def load_model_file(path, what="model file"):
    """`load_model(path)` for a file a user named: `check_model_file` first, and any error
    of Keras' reading (a bad CRC, a damaged HDF5 weights file, a config Keras cannot
    rebuild) as a one-line `UserError` naming the file."""
    check_model_file(path, what)
    try:
        return load_model(path)
    except Exception as err:  # noqa: BLE001 - zipfile, zlib, h5py, Keras: the same problem
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise UserError(f"{what} {path} is unreadable as a Keras model (corrupt: "
                        f"{type(err).__name__}: {detail}).") from err
