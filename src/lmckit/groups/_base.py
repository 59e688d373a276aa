"""The group protocol: what every symmetry group of a hidden space knows how to do.

A *group* acts on one hidden space of ``n`` units. Its elements ``T`` move a hidden
vector as ``h' = T h``; rectangular groups also hold ``m x n`` embeddings (``m >= n``)
of a narrow space into a wide one. Everything an aligner needs is a method here, so
an aligner never asks which group it holds, and a new group is one new module:

- algebra: :meth:`~Group.identity`, :meth:`~Group.random`, :meth:`~Group.embedding`,
  :meth:`~Group.compose`, :meth:`~Group.inverse`, :meth:`~Group.matrix`,
  :meth:`~Group.reader_matrix`, :meth:`~Group.dense_reader`, :meth:`~Group.dims`;
- action on a parameter axis laid out ``(outer, n, inner)``: :meth:`~Group.act`;
- the linear subproblem of coordinate descent, ``argmax_T <T, C>``:
  :meth:`~Group.solve` and :meth:`~Group.objective`; :meth:`~Group.project` (the
  nearest element to a dense matrix, for learned matching) and
  :meth:`~Group.soft_matrix` (a differentiable relaxation, where there is one);
  :meth:`~Group.smooth_projection` (the projection's gradient, where it has one);
- membership: :meth:`~Group.validate`, cheap enough to run on every ``apply``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Generic, Literal, NamedTuple, TypeVar

import torch
from torch import Tensor

__all__ = [
    "E",
    "Group",
    "MatrixGroup",
    "Role",
    "Statistic",
    "Subproblem",
    "check_square",
    "check_tensor",
    "check_wide",
    "contract_units",
]

Role = Literal["write", "read", "elementwise"]
#: activation statistic whose ``argmax_T <T, C>`` is the group's natural match.
Statistic = Literal["correlation", "covariance"]
#: a group's element type (a tensor or a small frozen dataclass).
E = TypeVar("E")


class Subproblem(NamedTuple):
    """One space's linear subproblem, what :meth:`Group.solve_subproblem` maximises.

    Attributes:
        sim: ``(m, n)`` similarity ``C`` between reference units (rows) and the other
            model's units (columns), e.g. ``C = sum_u A_u B_u^T``. For a
            :attr:`Group.unitwise` group this and the other square matrices may be
            given by their diagonals, ``(n,)``.
        gram: ``(n, n)`` Gram matrix of the other model's writers, for least-squares
            groups (:attr:`Group.least_squares`), else ``None``.
        norms: ``(m,)`` and ``(n,)`` Euclidean norms of the two models' unit
            features, for groups that compare units by cosine, else ``None``.
        readers: for least-squares groups that fit the readers too
            (:attr:`Group.fits_readers`): the readers' ``(m, n)`` similarity and the other
            model's ``(n, n)`` reader Gram, else ``None``.
    """

    sim: Tensor
    gram: Tensor | None = None
    norms: tuple[Tensor, Tensor] | None = None
    readers: tuple[Tensor, Tensor] | None = None


class Group(abc.ABC, Generic[E]):
    """A group (or, for rectangular maps, a set of embeddings) acting on a space.

    Subclasses are frozen dataclasses whose fields parameterise the group (e.g.
    ``Permutation(blocks=2)``) and implement the abstract methods; the class
    attributes below tell the aligners how the group's solver behaves.
    """

    #: elements may be ``m x n`` embeddings with ``m > n`` (width-heterogeneous maps).
    rectangular: ClassVar[bool] = False
    #: elementwise parameters (norm scales, statistics) may live in the space: only
    #: groups that move units without mixing or rescaling them allow that.
    elementwise_ok: ClassVar[bool] = True
    #: elements are diagonal: they commute with a scale of each unit, so a parameter
    #: scaling the units (a norm's weight) stays as it is and is no use of the space
    keeps_scales: ClassVar[bool] = False
    #: readers are contracted with the element's own matrix (``T^{-T} = T``, true for
    #: orthonormal columns): a dense, differentiable stand-in can be applied to every
    #: use alike, which is what learned matching does.
    self_dual: ClassVar[bool] = False
    #: learned matching can learn the group although its readers do not move by the
    #: element itself: :meth:`smooth_projection` is defined, and readers are contracted
    #: with the inverse transpose of the learned matrix (positive scalings, general
    #: invertible maps).
    learned_by_inverse: ClassVar[bool] = False
    #: :meth:`solve` returns the exact maximiser of ``<T, C>``, so coordinate descent
    #: accepts a new element only when it raises the objective. Otherwise (least
    #: squares, heuristics) any element that differs from the current one is taken.
    exact: ClassVar[bool] = True
    #: :meth:`solve` fits writers by least squares: it needs the other model's writer
    #: Gram matrix, and the similarity is built from writers only.
    least_squares: ClassVar[bool] = False
    #: a least-squares :meth:`solve` fits the readers too (their terms are passed apart,
    #: in :attr:`Subproblem.readers`): where writers alone leave the map free to shrink
    #: a unit to nothing, its readers grow without bound
    fits_readers: ClassVar[bool] = False
    #: :meth:`solve` compares units by cosine and needs both models' unit norms.
    needs_norms: ClassVar[bool] = False
    #: each unit is solved alone (a scaling): :meth:`solve_subproblem` and
    #: :meth:`objective` read only the diagonals of the subproblem's square matrices, so
    #: an aligner may pass those diagonals as ``(n,)`` vectors (``n K`` work per use
    #: instead of ``n^2 K`` for the full products).
    unitwise: ClassVar[bool] = False
    #: :meth:`act` only gathers along the axis (square index permutations): it works on
    #: integer index tensors, so an aligner can follow where each slice of a parameter
    #: came from and update a similarity by the slices that moved
    #: (:mod:`lmckit.aligners._weight.incremental`).
    gathers: ClassVar[bool] = False
    #: activation matching solves this group on the cross-correlation (Pearson) or on
    #: the cross-covariance (what Procrustes wants: Pearson normalisation is not
    #: orthogonally equivariant).
    natural_statistic: ClassVar[Statistic] = "correlation"

    @property
    def name(self) -> str:
        return type(self).__name__

    # ----------------------------------------------------------------------- algebra

    @abc.abstractmethod
    def identity(self, n: int) -> E:
        """The identity of a space of ``n`` units."""

    @abc.abstractmethod
    def random(self, n: int, generator: torch.Generator, *, m: int | None = None) -> E:
        """A random element (``m x n``; ``m`` defaults to ``n``) drawn from ``generator``."""

    def embedding(self, n: int, m: int) -> E:
        """The plain embedding of ``n`` units into ``m`` (the identity when ``m == n``).

        Weight matching starts a rectangular space here; square groups refuse
        ``m != n``.
        """
        check_square(m, n, self)
        return self.identity(n)

    @abc.abstractmethod
    def compose(self, second: E, first: E) -> E:
        """Element acting as ``first`` then ``second`` (matrix ``second @ first``)."""

    @abc.abstractmethod
    def inverse(self, element: E) -> E:
        """The inverse (square elements only)."""

    @abc.abstractmethod
    def matrix(self, element: E) -> Tensor:
        """Dense float64 matrix ``T`` of shape ``(m, n)`` with ``h' = T h``."""

    @abc.abstractmethod
    def dims(self, element: E) -> tuple[int, int]:
        """``(m, n)``: size of the target and of the source space."""

    def reader_matrix(self, element: E) -> Tensor:
        """Matrix ``L^T`` (``m x n``) applied along a reader's axis, where ``L T = I``."""
        return torch.linalg.pinv(self.matrix(element)).T

    def dense_reader(self, mat: Tensor) -> Tensor:
        """``T^{-T}`` of an element's dense matrix ``mat``, differentiable in ``mat`` (the
        reader matrix learned matching contracts readers with, for groups that are not
        self-dual)."""
        return torch.linalg.inv(mat).mT

    def act(self, x: Tensor, element: E, role: Role) -> Tensor:
        """Act on ``x`` of shape ``(outer, n, inner)`` along the middle axis."""
        if role == "elementwise":
            raise ValueError(f"{self.name} cannot act on elementwise parameters")
        mat = self.matrix(element) if role == "write" else self.reader_matrix(element)
        return contract_units(mat.to(device=x.device, dtype=x.dtype), x)

    def units(self, n: int) -> int | None:
        """How many whole units the group moves in a space of ``n`` (heads for head
        permutations), for groups whose elements carry nested spaces along
        (:class:`lmckit.symmetry.Nest`); ``None`` for groups that mix units."""
        return None

    def unit_index(self, element: E) -> Tensor:
        """For groups with :meth:`units`: ``perm`` with unit ``perm[i]`` moved to ``i``."""
        raise ValueError(f"{self.name} elements do not move whole units")

    def unit_factors(self, element: E, role: Role) -> Tensor | None:
        """For groups that scale each unit alone: the ``(n,)`` factors a use of
        ``role`` is multiplied by, unit by unit (a fast path of :meth:`act`); else
        ``None``."""
        return None

    def reindex(self, element: E, index: Tensor) -> E:
        """For groups acting on each unit alone (a scaling of each unit): the element
        whose unit ``i`` acts as ``element``'s unit ``index[i]`` did (its units carried
        along by a permutation of a space it is nested in)."""
        raise ValueError(f"{self.name} elements cannot be re-ordered unit by unit")

    def spread(self, sim: Tensor) -> Tensor:
        """For groups with :meth:`units`: a ``(units, units)`` similarity as the
        ``(n, n)`` similarity :meth:`solve` reads, with ``<T, spread(S)> = <P, S>`` for
        the element ``T`` moving units by ``P``."""
        raise ValueError(f"{self.name} elements do not move whole units")

    def close(self, first: E, second: E, *, atol: float = 1e-6) -> bool:
        """Whether two elements are the same map (``torch.allclose`` of their matrices)."""
        if self.dims(first) != self.dims(second):
            return False
        return bool(torch.allclose(self.matrix(first), self.matrix(second), atol=atol))

    def with_options(self, **options: object) -> Group[E]:
        """A copy with those of ``options`` that are fields of this group set.

        Lets an aligner pass a solver option (e.g. a semi-permutation's
        ``coefficients``) to every group that has it without asking which group it is.
        """
        names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        chosen = {k: v for k, v in options.items() if k in names}
        return dataclasses.replace(self, **chosen) if chosen else self  # type: ignore[type-var]

    # ----------------------------------------------------------------------- solving

    def solve(
        self,
        sim: Tensor,
        *,
        gram: Tensor | None = None,
        norms: tuple[Tensor, Tensor] | None = None,
    ) -> E:
        """The element maximising ``<T, sim> = tr(T^T sim)`` (see :class:`Subproblem`
        for the arguments); on the CPU whatever ``sim``'s device."""
        return self.solve_subproblem(Subproblem(sim, gram, norms))

    @abc.abstractmethod
    def solve_subproblem(self, problem: Subproblem) -> E:
        """The element maximising ``<T, problem.sim>``, returned on the CPU."""

    def objective(self, element: E, sim: Tensor) -> float:
        """``<T, sim>`` for ``element``."""
        mat = self.matrix(element).to(sim.device)  # float64: the product is summed in it
        return float((mat * sim).sum())

    def project(self, dense: Tensor) -> E:
        """The element nearest a dense ``(m, n)`` matrix: ``argmax_T <T, dense>``.

        For groups whose elements all have one Frobenius norm (permutations,
        orthogonal maps) this is the nearest element in Frobenius distance.
        """
        return self.solve_subproblem(Subproblem(dense.detach().float()))

    def soft_matrix(self, logits: Tensor, *, temperature: float, iters: int) -> Tensor | None:
        """A differentiable relaxation of the element nearest ``logits``, or ``None``."""
        return None

    def smooth_projection(self, dense: Tensor) -> Tensor | None:
        """The matrix of :meth:`project` as a differentiable function of ``dense``
        (learned matching follows its gradient; the value it uses is the exact
        projection), or ``None`` where the projection is piecewise constant."""
        return None

    # -------------------------------------------------------------------- membership

    @abc.abstractmethod
    def validate(self, element: object, n: int) -> None:
        """Raise a one-line ``ValueError`` unless ``element`` belongs to the group and
        acts on ``n`` units. Cheap: linear in the element's size for unit-moving
        groups, one ``T^T T`` or factorisation for continuous ones."""


def contract_units(mat: Tensor, x: Tensor) -> Tensor:
    """``mat @ x``: ``(m, n)`` times ``x`` of shape ``(outer, n, k)``, laid out as ``x`` is.

    A weight acted on along its columns arrives here as a transposed view (its units
    first). A row-major product would hand it back transposed, and the gathers and
    elementwise products that follow run several times slower on such a weight (a
    permutation of a ``5632 x 2048`` matrix's rows: 6x). Contracting from the side on
    which ``x`` is contiguous keeps the weight's own layout at no extra cost.
    """
    if x.stride(-2) == 1 and x.stride(-1) != 1:
        return (x.mT @ mat.mT).mT
    return torch.matmul(mat, x)


def check_square(m: int | None, n: int, group: Group) -> None:
    if m is not None and m != n:
        raise ValueError(f"{group.name} elements are square; got m={m}, n={n}")


def check_wide(m: int | None, n: int, group: Group) -> int:
    """The width ``m`` (default ``n``) that a rectangular group embeds ``n`` units
    into, checked to be at least ``n``."""
    m = n if m is None else m
    if m < n:
        raise ValueError(f"{group.name} embeds n={n} units into m >= n, got m={m}")
    return m


def check_tensor(element: object, group: Group, *, ndim: int, integer: bool) -> Tensor:
    """``element`` as a tensor of the right rank and kind, else a one-line error."""
    kind = "integer" if integer else "floating-point"
    if not isinstance(element, Tensor):
        raise ValueError(f"{group.name} element must be a {ndim}-D {kind} tensor, got {element!r}")
    floating = element.is_floating_point() or element.is_complex()
    if floating == integer or element.dtype == torch.bool:
        raise ValueError(f"{group.name} element must be a {kind} tensor, got {element.dtype}")
    if element.ndim != ndim:
        raise ValueError(f"{group.name} element must be {ndim}-D, got shape {tuple(element.shape)}")
    return element


class MatrixGroup(Group[Tensor]):
    """Groups whose element is its own dense ``(m, n)`` float matrix."""

    def identity(self, n: int) -> Tensor:
        return torch.eye(n)

    def compose(self, second: Tensor, first: Tensor) -> Tensor:
        return second @ first

    def matrix(self, element: Tensor) -> Tensor:
        return element.double()

    def dims(self, element: Tensor) -> tuple[int, int]:
        return element.shape[0], element.shape[1]
