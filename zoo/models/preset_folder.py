"""A zoo model as a preset folder in KerasHub's layout, and back.

    config.json                      the model, as `keras.saving.serialize_keras_object`
                                     writes it ({"module", "class_name", "config",
                                     "registered_name", "build_config"})
    model.weights.h5                 `model.save_weights`
    tokenizer.json                   the vocabulary's description: {"module", "class_name":
                                     "WordVocabulary", "config": {"vocabulary_size",
                                     "vocabulary_file", "end_of_sentence"}}
    assets/tokenizer/vocabulary.txt  one word per line, in id order
    metadata.json                    keras_version, tflm_version, parameter_count,
                                     date_saved, and what the caller adds (a trained run's
                                     provenance: `zoo.runs.preset_export`)

These are the file names of KerasHub's `save_to_preset` (a backbone's config.json and
model.weights.h5, a tokenizer.json with its assets, metadata.json). KerasHub's own
machinery (`keras_hub.models.Backbone.from_preset`, its `PresetLoader`) was weighed and not
used: it loads only subclasses of KerasHub's `Backbone` / `Task`, whose constructors and
preprocessing differ from a `tflm.LanguageModel`'s, and it would make keras-hub (and with
it tensorflow-text on some platforms) a dependency for a folder of five files. Hub handles
(kaggle://, hf://) need a download; we load local folders and zoo's preset names.

The folder is written whole or not at all: into a temporary folder beside it, each file
flushed, then renamed into place (an older preset folder there is replaced).
"""

import datetime
import json
import os
import pathlib
import secrets
import shutil

import keras

import tflm
from zoo.errors import UserError
from zoo.models.kinds import DEFAULT_KIND, MODEL_OWNED_TRAINING
from zoo.presets import list_presets, load_preset
from zoo.runs.atomic_files import fsync_dir, fsync_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TOKENIZER_FILE = "tokenizer.json"
VOCABULARY_FILE = "assets/tokenizer/vocabulary.txt"
METADATA_FILE = "metadata.json"
HUB_SCHEMES = ("kaggle://", "hf://", "gs://", "s3://", "http://", "https://")


def save_to_preset(model, preset_dir, vocabulary=None, metadata=None):
    """Write `model` as a preset folder at `preset_dir` (see the module docstring).
    `vocabulary`: the words in id order (default: `model.vocabulary`, set by
    `load_preset`); `metadata`: more entries for metadata.json."""
    target = check_target(preset_dir)
    if vocabulary is None:
        vocabulary = getattr(model, "vocabulary", None)
    if vocabulary is not None and len(vocabulary) != int(model.vocab_size):
        raise ValueError(f"save_to_preset: the vocabulary has {len(vocabulary)} words, the "
                         f"model predicts {int(model.vocab_size)}.")
    if not model.built:
        model.build((None, None))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{secrets.token_hex(4)}")
    try:
        _write(model, tmp, vocabulary, metadata or {})
        if target.exists():
            old = target.with_name(f".{target.name}.old-{secrets.token_hex(4)}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
        fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def check_target(path, what=""):
    """`path` as a `pathlib.Path` when it can become a preset folder (new, empty, or an older
    preset folder to replace), else `UserError` (`what` names the flag that gave it)."""
    path = pathlib.Path(path)
    if path.exists() and (not path.is_dir() or (any(path.iterdir())
                                                and not is_preset_folder(path))):
        raise UserError(f"{what}{path}: exists and is not a preset folder; give a new or "
                        "empty folder, or an older preset folder to replace.")
    return path


def _write(model, folder, vocabulary, metadata):
    folder.mkdir()
    files = {CONFIG_FILE: keras.saving.serialize_keras_object(model),
             METADATA_FILE: {"keras_version": keras.__version__,
                             "tflm_version": tflm.__version__,
                             "parameter_count": int(model.count_params()),
                             "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S"),
                             **metadata}}
    if vocabulary is not None:
        words = [str(w) for w in vocabulary]
        (folder / VOCABULARY_FILE).parent.mkdir(parents=True)
        (folder / VOCABULARY_FILE).write_text("\n".join(words) + "\n", encoding="utf-8")
        files[TOKENIZER_FILE] = {
            "module": __name__, "class_name": "WordVocabulary",
            "config": {"vocabulary_size": len(words), "vocabulary_file": VOCABULARY_FILE,
                       "end_of_sentence": "<eos>" if "<eos>" in words else None}}
    for name, value in files.items():
        (folder / name).write_text(json.dumps(value, indent=4) + "\n", encoding="utf-8")
    model.save_weights(folder / WEIGHTS_FILE)
    for path in folder.rglob("*"):
        if path.is_file():
            fsync_file(path)


def is_preset_folder(path):
    return pathlib.Path(path).is_dir() and (pathlib.Path(path) / CONFIG_FILE).is_file()


def load_preset_folder(preset_dir, cls=None, load_weights=True, **overrides):
    """The model of a preset folder: rebuilt from config.json (its `overrides` replacing
    config entries, as KerasHub's `from_preset(**kwargs)`), with the weights of
    model.weights.h5 unless `load_weights=False`, `model.vocabulary` (the words, or None)
    and `model.preset_metadata` (metadata.json). `cls`: the class the caller asked for
    (`zoo.AWDLSTM.from_preset`); a folder holding another family is refused."""
    folder = pathlib.Path(preset_dir)
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    config["config"] = dict(config.get("config", {}), **overrides)
    if overrides:  # new sizes make new shapes: built fresh, from the new config
        config.pop("build_config", None)
    model = keras.saving.deserialize_keras_object(config)
    if cls is not None and not isinstance(model, cls):
        raise UserError(f"{folder} holds a model of class {type(model).__name__}, not "
                        f"{cls.__name__}; load it with {type(model).__name__}.from_preset.")
    if not model.built:
        model.build((None, None))
    if load_weights:
        model.load_weights(folder / WEIGHTS_FILE)
    vocabulary = folder / VOCABULARY_FILE
    model.vocabulary = (tuple(vocabulary.read_text(encoding="utf-8").splitlines())
                        if vocabulary.is_file() else None)
    metadata = folder / METADATA_FILE
    model.preset_metadata = (json.loads(metadata.read_text(encoding="utf-8"))
                             if metadata.is_file() else {})
    return model


def check_preset_name(preset):
    """`UserError` for a hub handle (a download is needed first)."""
    if str(preset).startswith(HUB_SCHEMES):
        raise UserError(f"{preset}: loading from a hub needs its download; download the "
                        "preset folder and pass its path.")


def preset_model_arguments(preset):
    """(model.kind, the family's keyword arguments) of a preset dict: its `model` part (less
    `kind`) over the `training` fields a model owns (`kinds.MODEL_OWNED_TRAINING`), and the
    vocabulary size of its corpus; what `zoo.runs.builders.build_model` gives the family
    for the same preset."""
    model = dict(preset.get("model") or {})
    kind = model.pop("kind", DEFAULT_KIND)
    training = preset.get("training") or {}
    arguments = {k: training[k] for k in MODEL_OWNED_TRAINING if k in training}
    arguments.update(model)
    vocab_size = (preset.get("corpus") or {}).get("vocab_size")
    if vocab_size is not None:
        arguments.setdefault("vocab_size", vocab_size)
    return kind, arguments


def build_named_preset(cls, name, **overrides):
    """The untrained, built model of zoo preset `name`, as `cls` (its family's class, whose
    `preset_kind` the preset's model.kind must be); `overrides` replace arguments."""
    if str(name) not in list_presets():
        raise UserError(f"{name}: neither a preset folder (no {CONFIG_FILE} there) nor a zoo "
                        "preset name (zoo.list_presets()).")
    kind, arguments = preset_model_arguments(load_preset(str(name)))
    if kind != cls.preset_kind:
        raise UserError(f"preset {name} is of model.kind {kind!r}, not {cls.__name__}'s "
                        f"{cls.preset_kind!r}; build it with that family's from_preset.")
    arguments.update(overrides)
    if "vocab_size" not in arguments:
        raise UserError(f"preset {name} does not fix the vocabulary size; pass vocab_size=.")
    model = cls(**arguments)
    model.build((None, None))
    model.vocabulary, model.preset_metadata = None, {"preset": str(name)}
    return model
