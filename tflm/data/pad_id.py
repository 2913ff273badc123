"""The token id that marks a padded input position (imports nothing, so every layer of tflm
may use it: the batching that writes it, the masks and backends that read it)."""

PAD_ID = -1
"""The input id of a padding position (targets there are 0 and carry no loss)."""
