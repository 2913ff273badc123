"""Ready models and presets built from tflm: `zoo.AWDLSTM`, `zoo.from_preset`, `zoo.train`."""

from zoo.awd_lstm import AWDLSTM
from zoo.heads import head_names, make_head
from zoo.presets import from_preset, list_presets, load_preset
