"""The zoo's models: one folder per family, what every family shares, and saved models.

    registry.py             model.kind -> the family's class (MODEL_KINDS)
    kinds.py                the default kind, the training fields a model owns
    backbone_head_model.py  BackboneHeadModel: backbone + output head, what every family shares
    backbone_call.py        what every backbone's call shares: padding split, a layer from
                            its carried state, the outputs dict
    heads.py                output heads by name (a preset's model.head)
    awd_lstm/               AWDLSTMBackbone (awd_lstm_backbone.py), AWDLSTM (awd_lstm_lm.py)
    zaremba/                ZarembaBackbone (zaremba_backbone.py), ZarembaLSTM (zaremba_lm.py)
    mogrifier/              MogrifierBackbone (mogrifier_backbone.py), MogrifierLM (mogrifier_lm.py)
    transfer.py             a pre-trained model's weights into one with another head
    vocabulary.py           a saved model's vocabulary checked against a corpus
    saving.py               load_model: a saved zoo model (.keras)
    keras_registration.py   zoo's names known to Keras from its import (`import zoo`)
    preset_folder.py        a model as a KerasHub-layout preset folder, and from_preset

A new family is a folder here with `<family>_backbone.py` and `<family>_lm.py`, and its
name in `registry.MODEL_KINDS`. Nothing is imported here, so `import zoo.models.registry`
costs no Keras import.
"""
