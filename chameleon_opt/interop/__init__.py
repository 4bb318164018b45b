"""Interoperability with the trainers people run: torchtitan job configs, Megatron-LM arguments and
Hugging Face model configs in; the chosen plan out in each trainer's own vocabulary.

A device id of an imported instance *is* the trainer's global rank: the instance's `layout.order`
is set to the trainer's rank order, so `--failed 13` means the rank the trainer calls 13. Nothing
here imports torch or transformers.
"""
