"""Every reproduction preset trains with the settings of the command it cites."""

import pytest

from zoo.errors import ConfigError
from zoo.presets import list_presets, load_preset
from zoo.presets.reference import (REFERENCE_DEFAULTS, differences, implied_settings,
                                   parse_command)

REPRODUCTIONS = [name for name in list_presets() if name != "synthetic"]


@pytest.mark.parametrize("name", REPRODUCTIONS)
def test_preset_equals_its_reference_command(name):
    preset = load_preset(name)
    assert preset.get("reference"), f"{name} cites no reference command"
    assert implied_settings(preset), name
    assert differences(preset) == []


def test_the_deviations_found_by_reading_the_references_are_gone():
    doc = load_preset("awd_lstm_doc_ptb")
    assert doc["model"]["head"]["latent_dropout"] == 0.6
    assert (doc["training"]["epochs"], doc["training"]["nonmono"]) == (500, 60)
    assert doc["training"]["finetune_overrides"]["lr"] == 20.0
    mos = load_preset("awd_lstm_mos_wt2")
    assert (mos["training"]["seed"], mos["training"]["max_seq_len"]) == (1882, 90)
    assert mos["training"]["finetune_overrides"]["lr"] == 20.0
    assert load_preset("awd_lstm_plif_ptb")["model"]["head"]["init_scale"] == 1.0
    for name in ("awd_lstm_mos_wt2", "awd_lstm_gss_wt2", "awd_lstm_wt2"):
        assert "PTB" not in load_preset(name).get("reproduces", ""), name


def test_a_changed_field_is_reported_with_both_values():
    preset = load_preset("awd_lstm_mos_wt2")
    preset["training"]["seed"] = 1881
    preset["model"]["head"]["latent_dropout"] = 0.3
    found = {field: (ours, ref) for field, ours, ref in differences(preset)}
    assert found == {"training.seed": (1881, 1882),
                     "model.head.latent_dropout": (0.3, 0.29)}


def test_commands_are_read_as_argparse_reads_them():
    defaults = REFERENCE_DEFAULTS["zihangdai/mos"]
    flags = parse_command("python main.py --epoch 12 --lr 3 --single_gpu --data x", defaults)
    assert flags["epochs"] == 12 and flags["lr"] == 3.0 and flags["nhid"] == 1150
    with pytest.raises(ConfigError, match="unknown or ambiguous flag --dropo"):
        parse_command("python main.py --dropo 0.1", defaults)
    with pytest.raises(ConfigError, match="--nosuchflag"):
        parse_command("python main.py --nosuchflag 1", defaults)


def test_mos_latent_dropout_defaults_to_dropouth_as_in_the_reference():
    preset = load_preset("awd_lstm_mos_ptb")
    preset["reference"]["train"] = preset["reference"]["train"].replace("--dropoutl 0.29", "")
    assert implied_settings(preset)["model.head.latent_dropout"] == 0.225


def test_command_line_tool_reports_every_preset(capsys):
    from zoo.presets import reference
    assert reference.main([]) == 0
    printed = capsys.readouterr().out
    assert printed.count("matches its reference") == len(REPRODUCTIONS)


def test_every_preset_of_a_random_window_script_states_the_last_window_rate():
    """The presets that follow salesforce/awd-lstm-lm's main.py or a script made from it
    (random window lengths, lr x drawn length / bptt) state under "deviations" that an
    epoch's last, cut window trains at the rate of its real length here; the TensorFlow
    tutorial's presets (fixed windows) have no such window."""
    stating = {}
    for name in REPRODUCTIONS:
        preset = load_preset(name)
        random_windows = not preset.get("training", {}).get("fixed_windows")
        stating[name] = (random_windows, "last window" in preset.get("deviations", ""))
    assert {name for name, (random, states) in stating.items() if random != states} == set()
    assert stating["awd_lstm_ptb"] == stating["awd_lstm_mos_ptb"] == (True, True)
    assert stating["zaremba_small_ptb"] == (False, False)
