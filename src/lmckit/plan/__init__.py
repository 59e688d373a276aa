"""One plan from request to file: the four steps of ``lmckit align`` and ``lmckit.align``.

1. **plan** (:func:`plan_alignment`): one immutable :class:`AlignPlan`, built once from
   model A and an :class:`AlignRequest`: the method as its registry entry declares it,
   its config, the form as named steps worked out on A's graph (traced once), what will
   be written;
2. **describe** (:meth:`AlignPlan.describe`): the form and the output, a line each;
3. **run on B** (:meth:`AlignPlan.run`, :func:`run_plan`): B put through the same
   steps, the method, B's function checked on B, and how B aligned is written
   (:class:`Written`; a Hugging Face GPT-2 or ViT aligned in lmckit's form is lifted
   back into its class, :mod:`lmckit.plan._lift`);
4. **write** (:func:`write_aligned`): the one writer, for the command line and
   :meth:`lmckit.Aligned.save`.

The command line only parses these steps' arguments and prints what they say.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.plan._plan import AlignPlan, OutputPlan, plan_alignment
    from lmckit.plan._request import AlignRequest
    from lmckit.plan._run import AlignedPair, run_plan
    from lmckit.plan._write import write_aligned

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
