"""Local training as methods see it: re-exported from :mod:`secure_fl.training`, which sits below
both the methods and DP-SGD in the layers (see pyproject's import-linter contracts)."""

from secure_fl.training import (
    ClientData,
    FlatLayout,
    GradientCorrection,
    LocalObjective,
    LocalResult,
    LocalTrainer,
    LocalTraining,
    output_linear,
)

__all__ = [
    "ClientData", "FlatLayout", "GradientCorrection", "LocalObjective", "LocalResult", "LocalTrainer",
    "LocalTraining", "output_linear",
]
