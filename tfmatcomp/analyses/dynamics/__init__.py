"""Training dynamics: the sudden drop in the loss (:mod:`.drop`) and component-wise training
(:mod:`.components`), the NeurIPS paper Section 4; any measure over a run's checkpoints and seeds
(:mod:`.checkpoints`), the progress measures of matrix completion (:mod:`.progress`), how
early each one moves (:mod:`.lead`) and the local learning coefficient (:mod:`.llc`, with the
optional extra ``tfmatcomp[llc]``)."""

from tfmatcomp.analyses.dynamics.components import (
    PAPER_COMPONENTS, component_training, reinitialize_component, train_component,
)
from tfmatcomp.analyses.dynamics.checkpoints import over_checkpoints, run_seeds
from tfmatcomp.analyses.dynamics.drop import DropResult, detect_drop, summarize_drops
from tfmatcomp.analyses.dynamics.lead import departure_step, lead_time_summary, lead_times
from tfmatcomp.analyses.dynamics.llc import LLCResult, LLCSettings, llc, llc_measure
from tfmatcomp.analyses.dynamics.progress import (
    PROGRESS_MEASURES, copying, positional_rank, representation_collapse, row_column_attention_mass,
)

__all__ = [
    "DropResult", "detect_drop", "summarize_drops", "PAPER_COMPONENTS", "reinitialize_component",
    "train_component", "component_training", "over_checkpoints", "run_seeds", "PROGRESS_MEASURES",
    "row_column_attention_mass", "representation_collapse", "copying", "positional_rank",
    "departure_step", "lead_times", "lead_time_summary", "LLCSettings", "LLCResult", "llc",
    "llc_measure",
]
