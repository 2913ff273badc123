"""Shared pytest set-up: quiet TensorFlow, default data directory, backend subprocess helper."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
_SHARED_DATA = REPO.parent / "shared" / "data"


def data_dir():
    """The corpus directory for tests: $TFLM_DATA_DIR, else ../shared/data beside the repo."""
    env = os.environ.get("TFLM_DATA_DIR")
    if env:
        return pathlib.Path(env)
    return _SHARED_DATA


def ptb_available():
    d = data_dir()
    return all((d / "penn" / f"{s}.txt").exists() for s in ("train", "valid", "test"))


@pytest.fixture
def ptb_dir():
    if not ptb_available():
        pytest.skip(f"Penn Treebank not found under {data_dir()} (set TFLM_DATA_DIR)")
    return data_dir()


@pytest.fixture(autouse=True)
def _fresh_keras_session():
    import keras
    keras.utils.clear_session()
    yield
