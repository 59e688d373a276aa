"""`SymmetryReport.text`: what people read (the JSON keeps everything)."""

from __future__ import annotations

from lmckit.workflow._symmetries import SpaceSummary, SymmetryReport


def _report(fixed: int, folded: int = 0) -> SymmetryReport:
    return SymmetryReport(
        architecture="Net",
        symmetry=None,
        form="",
        spaces=(SpaceSummary("hidden.0", "Permutation", 16, ("a.weight", "b.weight")),),
        fixed=tuple(f"p{i}" for i in range(fixed)),
        folded=tuple(f"n{i}.weight" for i in range(folded)),
        elements=1000,
        moved_elements=875,
        left_out=("x: an op the rules do not know",),
    )


def test_text_shows_the_share_moved_and_shortens_long_lists() -> None:
    lines = _report(fixed=10, folded=3).text().splitlines()
    assert lines == [
        "Net: 1 space under the architecture's own groups",
        "  space     group         units  parameters",
        "  hidden.0  Permutation      16  2",
        "parameters some space moves: 87.5% of 1,000 elements",
        "norm scales folded into the layers that read them: 3",
        "fixed (no space moves them): p0, p1, p2, p3, p4, p5, p6, p7 and 2 more",
        "left out by the graph analysis:",
        "  x: an op the rules do not know",
    ]
    assert _report(fixed=8).to_dict()["fixed"] == tuple(f"p{i}" for i in range(8))
    assert "and" not in _report(fixed=8).text().splitlines()[-3]
