"""The papers' reported numbers for their 4-layer, 8-head BERT on 7x7 rank-2 matrices.

Source: the workshop paper (Gopalani, Lubana, Hu, workshop version), Sections 3.1-3.2 and Appendices C, J; the
"pre-shift" model is their step-4,000 checkpoint, "post-shift" the step-50,000 one; means over 256
samples (512 for the copying check). The experiment tables put these in columns named
``paper_4l8h_*`` on rows whose model is labelled ``"pre-shift"`` / ``"post-shift"`` and whose condition
the paper reports. They describe *that* model; a different model (the CPU tiny preset, another seed)
is expected to differ in the numbers and agree in the pattern.

Example:
    >>> from tfmatcomp.experiments.reference import PAPER_ABLATION_ALL
    >>> PAPER_ABLATION_ALL["post-shift"]["ablated"]
    {'L_obs': 0.0037, 'L_mask': 0.2183}
"""

from __future__ import annotations

__all__ = ["PAPER_LABEL", "PRE", "POST", "PAPER_COPYING", "PAPER_ABLATION_ALL", "PAPER_TRANSPLANT",
           "PAPER_PERMUTATION", "PAPER_PATCHING", "PAPER_HEAD_GROUP_VALUES", "PAPER_HEAD_GROUPS",
           "PAPER_TRAINING"]

PAPER_LABEL = "paper value, 4L8H BERT on 7x7 rank-2 matrices (the workshop paper)"
PRE, POST = "pre-shift", "post-shift"

#: Table 1 (pre-shift, 512 samples): inputs -> mask token -> {L_mask_prime, L_obs}.
PAPER_COPYING: dict[str, dict[str, dict[str, float]]] = {
    "low-rank": {"MASK": {"L_mask_prime": 3e-4, "L_obs": 3.3e-4},
                 "0.44": {"L_mask_prime": 4e-4, "L_obs": 2.8e-4},
                 "-0.24": {"L_mask_prime": 3.7e-4, "L_obs": 2.7e-4}},
    "random": {"MASK": {"L_mask_prime": 2.8e-4, "L_obs": 3.5e-4},
               "0.44": {"L_mask_prime": 3.7e-4, "L_obs": 3e-4},
               "-0.24": {"L_mask_prime": 3.6e-4, "L_obs": 2.8e-4}},
}

#: Uniform ablation of all heads (Sections 3.1.2, 3.2.1; 256 samples).
PAPER_ABLATION_ALL: dict[str, dict[str, dict[str, float]]] = {
    PRE: {"baseline": {"L_obs": 3.4e-4, "L_mask": 0.2236}, "ablated": {"L_obs": 3.2e-4, "L_mask": 0.2236}},
    POST: {"baseline": {"L_obs": 9.2e-5, "L_mask": 0.0128}, "ablated": {"L_obs": 3.7e-3, "L_mask": 0.2183}},
}

#: Q/K/V transplant (recipient, donor) -> reported values (Sections 3.1.2, 3.2.1; 256 samples).
PAPER_TRANSPLANT: dict[tuple[str, str], dict[str, float]] = {
    (PRE, POST): {"L_obs": 5e-3, "L_mask": 0.2246},
    (POST, PRE): {"L_obs": 9.5e-4},
}

#: Random permutation of the positional embeddings of the post-shift model (Section 3.2.1).
PAPER_PERMUTATION: dict[str, dict[str, float]] = {POST: {"L_obs": 2.4e-4, "L_mask": 0.5687}}

#: Patching hook_z of all layers X -> -X, post-shift, at masked entries (Appendix J).
PAPER_PATCHING: dict[str, dict[str, float]] = {"masked": {"mse_to_X": 0.014, "mse_to_neg_X": 0.8066}}

#: Head groups of the NeurIPS paper Section 3.2.2 / Appendix L (1-based labels, the papers' notation), and the
#: group of "uninterpretable" heads of the workshop paper Section 3.2.2.
PAPER_HEAD_GROUPS: dict[str, str] = {
    "masked-row": "(2,1), (3,4), (4,8)",
    "observed-copy": "(4,3), (4,4)",
    "mask-ignore": "(2,2-4), (2,6), (3,2), (3,3), (3,5), (3,1), (3,6)",
    "longest-contiguous-column": "(2,5), (2,7), (2,8)",
    "input-processing": "(1,1-2), (1,5-8)",
    "uninterpretable": "(3,3), (4,2), (4,5-7)",
}

#: Reported values for head groups (post-shift): only the seed-000 group survived extraction; the
#: numbers of the NeurIPS paper Appendix L were lost.
PAPER_HEAD_GROUP_VALUES: dict[str, dict[str, float]] = {
    "uninterpretable": {"L_obs_without": 9.44e-5, "L_obs_with": 9.36e-5,
                        "L_mask_without": 0.01428, "L_mask_with": 0.01575},
}

#: The training curve (the workshop paper Sec. 2 / Fig. 1; the NeurIPS paper Fig. 1): L_mask on the plateau (the
#: pre-shift value above), the step near which it drops, and the final L and L_mask.
PAPER_TRAINING: dict[str, float] = {"plateau_L_mask": 0.2236, "drop_step": 15_000, "final_L": 4e-3,
                                    "final_L_mask": 0.0128}
