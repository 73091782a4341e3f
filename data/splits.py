"""Which simulated scans are for training, validation and evaluation: every seed range in one place.

A simulated scan is a pure function of its seed (:func:`ctpore.data.synthetic.make_pair`), so a
split is a range of seeds, and two splits share no scan exactly when their ranges are disjoint.
The ranges, half-open ``[start, stop)``, with ``s = data.seed`` of a training config:

- **training**: ``s * SEED_STRIDE + i`` for ``i < n_train`` (:func:`training_range`);
- **validation**: ``s * SEED_STRIDE + VAL_OFFSET + i`` for ``i < max(n_val, POSTPROCESSING_SCANS)``
  (:func:`validation_range`): the run validates on the first ``n_val``, its export chooses the
  post-processing and fits the calibration on the first ``POSTPROCESSING_SCANS``;
- **further held-out**: ``FURTHER_SEED_BASE .. FURTHER_SEED_STOP - 1`` (:data:`FURTHER`), the seed
  block of ``data.seed = FURTHER_DATA_SEED`` (2), which no config may use: the scans candidates are
  compared on before one ships (``ctpore bench quality --seed-base 2000100``, ``--seed-base 2300100``);
- **benchmark**: ``BENCH_SEED_BASE`` on (:data:`BENCHMARK`): ``ctpore bench quality``.

``ctpore bench quality`` simulates the seeds ``seed_base + i`` for ``i < n_sim``
(:func:`bench_range`), ``seed_base`` an absolute seed (default :data:`BENCH_SEED_BASE`).

A config's training and validation ranges stay inside its own block ``[s * SEED_STRIDE, (s + 1) *
SEED_STRIDE)`` (``n_train <= VAL_OFFSET``, ``max(n_val, POSTPROCESSING_SCANS) <= SEED_STRIDE -
VAL_OFFSET``), its block is not the further held-out one (``s != FURTHER_DATA_SEED``) and lies below
the benchmark's (``s < BENCH_SEED_BASE // SEED_STRIDE``), so no config reaches another config's
scans or a held-out scan. :func:`check_config_seeds` enforces this where a training config is read;
:func:`check_bench_seeds` keeps the benchmark's simulated scans inside the benchmark's or the
further held-out range, where no config can reach. Both raise :class:`~ctpore.errors.InputError`
naming the two ranges that overlap (:func:`check_disjoint`).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Optional, Union

from ctpore.errors import InputError

__all__ = [
    "SEED_STRIDE",
    "VAL_OFFSET",
    "POSTPROCESSING_SCANS",
    "BENCH_SEED_BASE",
    "FURTHER_DATA_SEED",
    "FURTHER_SEED_BASE",
    "FURTHER_SEED_STOP",
    "SeedRange",
    "BENCHMARK",
    "FURTHER",
    "train_seed",
    "val_seed",
    "training_range",
    "validation_range",
    "config_ranges",
    "bench_range",
    "check_disjoint",
    "check_config_seeds",
    "check_bench_seeds",
]

#: Seeds of one training config's scans start at ``data.seed * SEED_STRIDE``.
SEED_STRIDE = 1_000_000

#: Validation scans start this far after the training scans of the same config.
VAL_OFFSET = 500_000

#: Simulated scans from the validation seed range (:func:`val_seed`, the first ``data.n_val`` of
#: them the run's validation set) on which the post-processing is chosen and the calibration fitted
#: at export (:func:`ctpore.pipelines.train.export.postprocessing_pool`). Twelve were too few for a
#: stable map (the reliability of a dozen scans varies much from one dozen to the next).
POSTPROCESSING_SCANS = 48

#: First seed of the benchmark's held-out simulated scans.
BENCH_SEED_BASE = 10**12

#: The ``data.seed`` whose seed block holds the further held-out scans; no training config may use it.
FURTHER_DATA_SEED = 2

#: First seed of the further held-out range (``ctpore bench quality --seed-base 2000100`` draws from it).
FURTHER_SEED_BASE = FURTHER_DATA_SEED * SEED_STRIDE

#: End (exclusive) of the further held-out range.
FURTHER_SEED_STOP = FURTHER_SEED_BASE + SEED_STRIDE


@dataclass(frozen=True)
class SeedRange:
    """A named half-open range of seeds ``[start, stop)``, for checks and for messages.

    Parameters
    ----------
    name : str
        What the seeds are, as a message names them ("training seeds").
    start : int
        First seed.
    stop : int, optional
        One past the last seed; None: no end.
    detail : str
        Where the range comes from ("data.seed 1, n_train 192"), shown in brackets.
    """

    name: str
    start: int
    stop: Optional[int] = None
    detail: str = ""

    def __contains__(self, seed: int) -> bool:
        return seed >= self.start and (self.stop is None or seed < self.stop)

    @property
    def empty(self) -> bool:
        """True when the range holds no seed."""
        return self.stop is not None and self.stop <= self.start

    def overlaps(self, other: "SeedRange") -> bool:
        """True when a seed lies in both ranges."""
        if self.empty or other.empty:
            return False
        return (other.stop is None or self.start < other.stop) and (self.stop is None or other.start < self.stop)

    def within(self, other: "SeedRange") -> bool:
        """True when every seed of this range lies in ``other`` (an empty range lies in any)."""
        if self.empty:
            return True
        if self.start < other.start:
            return False
        return other.stop is None or (self.stop is not None and self.stop <= other.stop)

    def __str__(self) -> str:
        """``"<name> <first>..<last> (<detail>)"``: the last seed inclusive, ``<first>..`` without an end."""
        if self.empty:
            seeds = "(none)"
        else:
            seeds = f"{self.start}.." + ("" if self.stop is None else str(self.stop - 1))
        return f"{self.name} {seeds}" + (f" ({self.detail})" if self.detail else "")


#: The benchmark's held-out simulated scans (``ctpore bench quality`` without ``--seed-base``).
BENCHMARK = SeedRange("the benchmark's held-out seeds", BENCH_SEED_BASE)

#: The further held-out scans for choosing between candidates (``--seed-base 2000100``, ``2300100``).
FURTHER = SeedRange("the further held-out seeds", FURTHER_SEED_BASE, FURTHER_SEED_STOP,
                    f"the seed block of data.seed {FURTHER_DATA_SEED}")


def train_seed(data_seed: int, i: int) -> int:
    """Seed of training scan ``i`` of a config with ``data.seed = data_seed``."""
    return data_seed * SEED_STRIDE + i


def val_seed(data_seed: int, i: int) -> int:
    """Seed of validation scan ``i`` of a config with ``data.seed = data_seed``."""
    return data_seed * SEED_STRIDE + VAL_OFFSET + i


def training_range(data_seed: int, n_train: int) -> SeedRange:
    """The training seeds of a config: ``train_seed(data_seed, i)`` for ``i < n_train``."""
    start = train_seed(data_seed, 0)
    return SeedRange("training seeds", start, start + n_train, f"data.seed {data_seed}, n_train {n_train}")


def validation_range(data_seed: int, n_val: int) -> SeedRange:
    """The validation seeds of a config: ``val_seed(data_seed, i)`` for ``i < max(n_val, POSTPROCESSING_SCANS)``.

    The run validates on the first ``n_val``; its export chooses the post-processing and fits the
    calibration on the first :data:`POSTPROCESSING_SCANS` (or ``n_val``, if more), so the range
    covers those too.
    """
    start = val_seed(data_seed, 0)
    n = max(n_val, POSTPROCESSING_SCANS)
    detail = f"data.seed {data_seed}, n_val {n_val}" + (f", {n} at export" if n != n_val else "")
    return SeedRange("validation seeds", start, start + n, detail)


def config_ranges(data_seed: int, n_train: int, n_val: int) -> tuple[SeedRange, SeedRange]:
    """The training and the validation seed range a training config draws (unchecked).

    Parameters
    ----------
    data_seed, n_train, n_val : int
        ``data.seed``, ``data.n_train`` and ``data.n_val`` of the config.

    Returns
    -------
    training, validation : SeedRange
        :func:`training_range` and :func:`validation_range`.
    """
    return training_range(data_seed, n_train), validation_range(data_seed, n_val)


def bench_range(seed_base: int, n_sim: int) -> SeedRange:
    """The seeds of the simulated cases of ``ctpore bench quality``: ``seed_base + i``, ``i < n_sim``.

    ``seed_base`` is an absolute seed (the default is :data:`BENCH_SEED_BASE`; ``--seed-base
    2000100`` simulates seeds 2000100, 2000101, ...), not an offset.
    """
    return SeedRange("the benchmark's simulated seeds", seed_base, seed_base + n_sim,
                     f"--seed-base {seed_base}, --n-sim {n_sim}")


def check_disjoint(a: SeedRange, b: SeedRange, advice: str = "",
                   path: Union[str, os.PathLike, None] = None) -> None:
    """Raise an InputError naming both ranges when ``a`` and ``b`` share a seed.

    Parameters
    ----------
    a, b : SeedRange
        The ranges; the message reads "<a> overlap <b>; <advice>".
    advice : str
        What to do instead.
    path : str or Path, optional
        The file the ranges come from (a training config), put in front of the message.

    Raises
    ------
    InputError
        When the ranges overlap.
    """
    if a.overlaps(b):
        raise InputError(f"{a} overlap {b}" + (f"; {advice}" if advice else ""), path=path)


def _count(value, name: str, path=None, hint: str = "") -> int:
    """``value`` as an int if it is a whole number >= 0, else an InputError (YAML may give a float, a
    string or a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InputError(f"{name} must be a whole number >= 0{hint}, got {value!r}", path=path)
    return int(value)


def _block(data_seed: int) -> SeedRange:
    """What the seed block of ``data_seed`` is: the benchmark's, the further held-out one, or a config's."""
    if data_seed * SEED_STRIDE >= BENCH_SEED_BASE:
        return BENCHMARK
    if data_seed == FURTHER_DATA_SEED:
        return FURTHER
    return SeedRange("training seeds", train_seed(data_seed, 0), train_seed(data_seed, VAL_OFFSET),
                     f"data.seed {data_seed}, n_train up to {VAL_OFFSET}")


def check_config_seeds(data_seed, n_train, n_val, path: Union[str, os.PathLike, None] = None
                       ) -> tuple[SeedRange, SeedRange]:
    """Check that a training config's seed ranges are disjoint from every other split's.

    Refused: a negative (or non-integer) ``data.seed``, ``n_train`` or ``n_val``; ``n_train`` above
    :data:`VAL_OFFSET` (training would run into the validation seeds); ``max(n_val,
    POSTPROCESSING_SCANS)`` above ``SEED_STRIDE - VAL_OFFSET`` (validation would run into the next
    config's training seeds, or a held-out range); ``data.seed`` :data:`FURTHER_DATA_SEED` (the
    further held-out scans); a ``data.seed`` whose scans reach :data:`BENCH_SEED_BASE`.

    Parameters
    ----------
    data_seed, n_train, n_val : int
        ``data.seed``, ``data.n_train`` and ``data.n_val`` of the config.
    path : str or Path, optional
        The config file, named in the error.

    Returns
    -------
    training, validation : SeedRange
        The config's ranges (:func:`config_ranges`).

    Raises
    ------
    InputError
        Naming the two ranges that overlap and what to choose instead.
    """
    data_seed = _count(data_seed, "data.seed", path, f" (0 to {BENCH_SEED_BASE // SEED_STRIDE - 1}, "
                                                    f"not {FURTHER_DATA_SEED})")
    n_train = _count(n_train, "data.n_train", path)
    n_val = _count(n_val, "data.n_val", path)
    training, validation = config_ranges(data_seed, n_train, n_val)
    last_ok = BENCH_SEED_BASE // SEED_STRIDE - 1
    # a data.seed whose block is held out: whatever n_train and n_val, its scans are held-out scans
    for held_out, advice in ((BENCHMARK, f"choose data.seed below {last_ok + 1}"),
                             (FURTHER, f"data.seed {FURTHER_DATA_SEED} is reserved for them; choose another "
                                       f"data.seed, e.g. {FURTHER_DATA_SEED + 1}")):
        if training.start in held_out or validation.start in held_out:
            for r in (training, validation):
                check_disjoint(r, held_out, advice, path)
    check_disjoint(training, validation, f"choose data.n_train at most {VAL_OFFSET}", path)
    nxt = _block(data_seed + 1)
    check_disjoint(validation, nxt, f"choose data.n_val at most {SEED_STRIDE - VAL_OFFSET}", path)
    for r in (training, validation):  # holds after the checks above; kept as the rule itself
        check_disjoint(r, BENCHMARK, f"choose data.seed below {last_ok + 1}", path)
        check_disjoint(r, FURTHER, f"choose a data.seed other than {FURTHER_DATA_SEED}", path)
    return training, validation


def check_bench_seeds(seed_base, n_sim) -> SeedRange:
    """Check that the benchmark's simulated seeds are held out: no training config can reach them.

    They must lie in :data:`BENCHMARK` (``BENCH_SEED_BASE`` on) or in :data:`FURTHER` (the further
    held-out scans, ``FURTHER_SEED_BASE .. FURTHER_SEED_STOP - 1``); every other seed below
    :data:`BENCH_SEED_BASE` is a training or validation seed of some ``data.seed``.

    Parameters
    ----------
    seed_base : int
        The first seed (absolute, see :func:`bench_range`).
    n_sim : int
        The number of simulated cases.

    Returns
    -------
    SeedRange
        The cases' seeds (:func:`bench_range`).

    Raises
    ------
    InputError
        Naming the cases' seeds, the config range they overlap and where to simulate instead.
    """
    seed_base = _count(seed_base, "the seed base")
    n_sim = _count(n_sim, "the number of simulated scans")
    cases = bench_range(seed_base, n_sim)
    if cases.within(BENCHMARK) or cases.within(FURTHER):
        return cases
    # the first seed that is neither held-out range's, and the config range it belongs to
    first = FURTHER_SEED_STOP if cases.start in FURTHER else cases.start
    block = first // SEED_STRIDE
    if first - block * SEED_STRIDE < VAL_OFFSET:
        reach = _block(block)
    else:
        reach = SeedRange("validation seeds", val_seed(block, 0), train_seed(block + 1, 0),
                          f"data.seed {block}, n_val up to {SEED_STRIDE - VAL_OFFSET}")
    check_disjoint(cases, reach, f"use --seed-base {BENCH_SEED_BASE} or more (the benchmark's held-out "
                                 f"seeds) or keep the cases inside {FURTHER_SEED_BASE}..{FURTHER_SEED_STOP - 1} "
                                 f"(the further held-out seeds, e.g. --seed-base 2000100)")
    raise AssertionError(f"{cases} are held out and yet not inside a held-out range")  # pragma: no cover
