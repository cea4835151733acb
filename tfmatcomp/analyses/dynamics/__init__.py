"""Training dynamics: the sudden drop in the loss (:mod:`.drop`) and component-wise training
(:mod:`.components`), the NeurIPS paper Section 4."""

from tfmatcomp.analyses.dynamics.components import (
    PAPER_COMPONENTS, component_training, reinitialize_component, train_component,
)
from tfmatcomp.analyses.dynamics.drop import DropResult, detect_drop, summarize_drops

__all__ = [
    "DropResult", "detect_drop", "summarize_drops", "PAPER_COMPONENTS", "reinitialize_component",
    "train_component", "component_training",
]
