"""Which provenance values the audit compares (docs/protocol.md §12.1), on the folds it will use.

The outer folds are dealt once over every patient of the run, before any group is chosen (audit.outer_folds), so
every variable sees the same folds; a value is then kept by the rule the cell-support gate checks, fold by fold:
in every fold its held-out records hold `min_group_records` records and `min_cell_records` of each class of y, and
its training records `min_group_records` and 2 of each class. A value that fails is pooled into `other` when the
pool passes, else left out, and the note names the first failing fold and cell ("0 non-NORM records in test fold
3 (minimum 75)"). A record without a value (an empty or NaN cell of the manifest) is no group: it is left out and
counted. With strata (`device|site`: devices compared within each site), groups are (stratum, value) pairs, the
pooling happens within a stratum, and a stratum needs two groups of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_CLASS_RECORDS = 2  # records of each target class a provenance group needs in every training set
OTHER = "other"  # the pooled group of provenance values too small on their own
MISSING_VALUES = ("", "nan", "NaN", "None", "<NA>", "NaT")
STRATUM_SEP = "/"  # a stratified group's label: stratum / value


def missing(labels: np.ndarray) -> np.ndarray:
    """True for a record without a value of the variable."""
    return np.isin(np.char.strip(np.asarray(labels).astype(str)), MISSING_VALUES)


@dataclass(frozen=True)
class Roles:
    """Per fold, masks over the pooled records (train, val, test splits concatenated): its test and train sets,
    and how the note names the fold ("test fold 3", or "the test split" for the run's own split)."""

    test: list[np.ndarray]
    train: list[np.ndarray]
    names: list[tuple[str, str]]  # (held-out set, training set) of each fold, as the notes name them

    @classmethod
    def of(cls, fold_ids: np.ndarray | None, split_sizes: tuple[int, int, int]) -> Roles:
        """fold_ids: the fold of each pooled record (None: the run's own split, sizes of train / val / test)."""
        if fold_ids is None:
            n_tr, n_val, n_te = split_sizes
            which = np.repeat([0, 1, 2], [n_tr, n_val, n_te])
            return cls([which == 2], [which == 0], [("the test split", "the train split")])
        n = int(fold_ids.max()) + 1 if len(fold_ids) else 1
        return cls([fold_ids == f for f in range(n)],
                   [(fold_ids != f) & (fold_ids != (f + 1) % n) for f in range(n)],
                   [(f"test fold {f + 1}", f"the training set of fold {f + 1}") for f in range(n)])


@dataclass(frozen=True)
class Rule:
    min_records: int
    min_cell: int
    target: str  # the diagnostic superclass y = 1 stands for

    def cause(self, member: np.ndarray, y: np.ndarray, roles: Roles) -> str | None:
        """Why the records `member` cannot be a group on these folds (the first failing fold and cell), or None."""
        names = (f"non-{self.target}", self.target)
        need = max(MIN_CLASS_RECORDS, self.min_cell)
        for test, train, (test_name, train_name) in zip(roles.test, roles.train, roles.names, strict=True):
            for mask, place, per_class in ((test, test_name, need), (train, train_name, MIN_CLASS_RECORDS)):
                m = member & mask
                n, n_pos = int(m.sum()), int(y[m].sum())
                if n < self.min_records:
                    return f"{n} records in {place} (minimum {self.min_records})"
                for cls, cnt in ((0, n - n_pos), (1, n_pos)):
                    if cnt < per_class:
                        return f"{cnt} {names[cls]} records in {place} (minimum {per_class})"
        return None


@dataclass(frozen=True)
class Selection:
    """groups: {value: audited group}; notes: {value: why pooled or left out}; stratum: {group: its stratum}
    (None without strata)."""

    groups: dict[str, str]
    notes: dict[str, str]
    stratum: dict[str, str] | None

    @property
    def n_groups(self) -> int:
        return len(set(self.groups.values()))


def _select(values: np.ndarray, strata: np.ndarray | None, y: np.ndarray, roles: Roles,
            rule: Rule, stratum_name: str) -> Selection:
    groups, notes, of_stratum = {}, {}, {}
    keys = [None] if strata is None else sorted(set(strata[~missing(values)]))
    for st in keys:
        in_st = np.ones(len(values), dtype=bool) if st is None else strata == st
        names = sorted(set(values[in_st]) - {""})
        other = OTHER if st is None else f"{st}{STRATUM_SEP}{OTHER}"
        local, small = {}, []
        for g in names:
            why = rule.cause(in_st & (values == g), y, roles)
            if why is None:
                local[g] = g
            else:
                small.append(g)
                notes[g] = why
        if small and other not in local and rule.cause(in_st & np.isin(values, small), y, roles) is None:
            for g in small:
                local[g] = other
                notes[g] += f", pooled into {other!r}"
        if st is not None and len(set(local.values())) < 2:
            for g in names:
                notes[g] = (notes.get(g, "enough records") + f"; {stratum_name} {st} holds "
                            f"{len(set(local.values()))} audited group(s), 2 needed within it")
            continue
        groups.update(local)
        of_stratum.update({grp: st for grp in local.values()})
    return Selection(groups, notes, None if strata is None else of_stratum)


def select_groups(values: np.ndarray, strata: np.ndarray | None, y: np.ndarray, roles: Roles,
                  rule: Rule, stratum_name: str = "stratum") -> Selection:
    """The audited groups of pooled labels `values` (stratified labels already read stratum / value). When the
    held-out cell minimum leaves fewer than two groups, the grouping without it is returned, so the cell-support
    gate names the small cell (or the sensitivity analysis runs)."""
    values = np.where(missing(values), "", np.asarray(values).astype(str))
    sel = _select(values, strata, y, roles, rule, stratum_name)
    if rule.min_cell and sel.n_groups < 2:
        sel = _select(values, strata, y, roles, Rule(rule.min_records, 0, rule.target), stratum_name)
    n_missing = int((values == "").sum())
    if n_missing:
        sel.notes["(no value)"] = f"{n_missing} records without a value"
    return sel
