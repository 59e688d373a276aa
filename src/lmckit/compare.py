"""Old home of the barrier-table helpers; they now live in library modules.

Kept so existing imports work. New code imports from:

* :mod:`lmckit.measure`: ``EvalSettings``, ``measure_path``, ``train_inputs``,
  ``format_table`` (and the shared rules ``eval_batch_size``, ``resolve_fix``);
* :mod:`lmckit.workflow`: ``METHODS``, ``align_pair``, ``compare_alignments``.
"""

from lmckit.measure import FIXES, EvalSettings, format_table, measure_path, train_inputs
from lmckit.workflow import METHODS, align_pair, compare_alignments

__all__ = [
    "FIXES",
    "METHODS",
    "EvalSettings",
    "align_pair",
    "compare_alignments",
    "format_table",
    "measure_path",
    "train_inputs",
]
