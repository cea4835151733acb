"""Song & Zhong (2023) applied to language models: corpus, training, Section 5, the command.

The measurements themselves are plain functions of tensors in :mod:`tfmatcomp.geometry`; this
package brings the data and models they are measured on.

* :mod:`~tfmatcomp.task.corpus`: text cut into contexts;
* :mod:`~tfmatcomp.song_zhong.lm`: a small character-level GPT trained offline;
* :mod:`~tfmatcomp.geometry.models`: models seen the way the paper measures them;
* :mod:`~tfmatcomp.geometry.induction`: the induction-head study (Section 4.1);
* :mod:`~tfmatcomp.analyses.training_format`: "why training format matters" (Section 5);
* :mod:`~tfmatcomp.geometry.reference`: the paper's published numbers;
* :mod:`~tfmatcomp.report.geometry`: ``tfmatcomp geometry``.
"""
