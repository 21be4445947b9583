"""The names of the DPO family's losses (TRL's ``loss_type`` names), kept free of torch so that
configs validate against them without importing it; :mod:`alignflow.losses.dpo_losses` holds
one function per name."""

DPO_LOSS_TYPES: tuple[str, ...] = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
