"""Song & Zhong (2023) applied to language models: corpus, training, Section 5, the command.

The measurements themselves are plain functions of tensors in :mod:`tfmatcomp.geometry`; this
package brings the data and models they are measured on.

* :mod:`~tfmatcomp.song_zhong.corpus`: text cut into contexts;
* :mod:`~tfmatcomp.song_zhong.models`: models seen the way the paper measures them;
* :mod:`~tfmatcomp.song_zhong.induction`: the induction-head study (Section 4.1);
* :mod:`~tfmatcomp.song_zhong.section5`: "why training format matters" (Section 5);
* :mod:`~tfmatcomp.song_zhong.paper`: the paper's published numbers;
* :mod:`~tfmatcomp.song_zhong.command`: ``tfmatcomp geometry``.
"""
