"""Bring a Hugging Face model: a BERT built from a config object (random init, nothing downloaded) as a lab
workload, on the helper's synthetic padded token streams.

    python -m lab run --workload examples/hf_bert.py:make --size tiny --threads 1 --quant dynamic
    python -m lab run --workload examples/hf_bert.py:make --size tiny --threads 1 \\
        --prune structured_channels --prune-amount 0.5 --prune-finetune-epochs 1 --prune-finetune-lr-factor 1

Needs the ``[hf]`` extra (``pip install -e '.[hf]'``). What each technique needs from a model:
docs/workloads.md, "Bring a Hugging Face model". ``tests/ecosystem/test_hf_example.py`` loads this file.
"""

from __future__ import annotations

from torch import nn

from lab.workloads import Workload, hf


def bert() -> nn.Module:
    """A 2-layer BERT classifier sized for the synthetic data (64 tokens, 16 positions, 4 classes). Dropout off:
    with dropout on, compiled and eager training draw different masks, so compare them over seeds."""
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=16, num_labels=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def make() -> Workload:
    """The workload: ``hf.workload`` wraps the model (tuple batch in, ``ModelOutput.logits`` out) and supplies
    deterministic data for the task (``input_ids``, ``attention_mask``, label)."""
    return hf.workload(bert, task="sequence_classification", name="my_hf_bert",
                       description="my BERT (examples/hf_bert.py) on padded marker streams")
