"""``lkv train``: the configuration, the data a step reads, and the training loop."""

from ..objective import kl_per_example, loss_per_example, record_target
from .config import RESUMABLE, TrainConfig, config_fields
from .data import (PrefillCache, batch_kl, batch_loss, check_targets, data_order, split_records, usable_split,
                   validation_kl)
from .loop import Trainer, lr_lambda, train

__all__ = ["RESUMABLE", "PrefillCache", "TrainConfig", "Trainer", "batch_kl", "batch_loss", "check_targets",
           "config_fields", "data_order", "kl_per_example", "loss_per_example", "lr_lambda", "record_target",
           "split_records", "train", "usable_split", "validation_kl"]
