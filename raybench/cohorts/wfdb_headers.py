"""A `wfdb` cohort's records as their headers describe them: found recursively, parsed without reading signals.

Any folder of WFDB records is a cohort (docs/protocol.md §2.7): every `.hea` file under the root is one record,
whatever signal files it names (PTB-XL's `.dat`, the PhysioNet/CinC Challenge's `.mat` with a byte offset).
The header gives the rate, the length, the lead names and, in `#Key: value` comment lines, what the Challenge
headers carry: `#Age`, `#Sex`, `#Dx` (SNOMED-CT codes), and any other key a collection writes (`#Site`,
`#Device`, a patient key). A header that cannot be parsed becomes a quarantine reason here, never an exception.

`#Dx` codes map to PTB-XL's diagnostic superclasses through `DX_SUPERCLASS` (the target of the provenance
audit, docs/protocol.md §12.1): a record is NORM when it carries sinus rhythm and no code of another superclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raybench.cohorts.waveforms import parse_header

# SNOMED-CT codes of the 2020/2021 Challenge label set -> PTB-XL diagnostic superclass (codes of rhythm, axis or
# conduction-irrelevant statements map to none); what `#Dx` says about the provenance audit's target y
DX_SUPERCLASS: dict[str, str] = {
    "164865005": "MI", "57054005": "MI",  # myocardial infarction, acute MI
    "164861001": "STTC", "164934002": "STTC", "59931005": "STTC", "429622005": "STTC",  # ischemia, TAb, TInv, STD
    "164931005": "STTC", "428750005": "STTC", "55930002": "STTC",  # ST elevation, NSST-T, ST changes
    "164909002": "CD", "733534002": "CD", "59118001": "CD", "713427006": "CD", "713426002": "CD",  # BBBs
    "445118002": "CD", "445211001": "CD", "270492004": "CD", "698252002": "CD", "6374002": "CD",  # fascicular,
    "195042002": "CD", "54016002": "CD", "28189009": "CD", "27885002": "CD", "233917008": "CD",  # AV blocks, IVCD
    "164873001": "HYP", "89792004": "HYP", "67741000119109": "HYP", "446358003": "HYP",  # LVH, RVH, LAE, RAE
}
SINUS_RHYTHM = "426783006"  # NORM when no other superclass is named
NORM = "NORM"


@dataclass(frozen=True)
class HeaderInfo:
    """One record's header: what the manifest needs before any signal is read."""

    path: str  # record base relative to the root, POSIX, no extension
    name: str  # the record name (the file name without .hea)
    fs: float
    n_samples: int | None
    leads: tuple[str, ...]  # signal names as the header writes them
    comments: dict[str, str] = field(default_factory=dict)  # `#Key: value` lines, keys lower-case


@dataclass(frozen=True)
class HeaderProblem:
    path: str
    reason: str
    detail: str


def find_headers(root: Path) -> list[str]:
    """Every `.hea` under `root` (recursively, symlinks not followed) as record paths relative to it, sorted."""
    found = [p for p in root.rglob("*.hea") if p.is_file() and not p.is_symlink()]
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in found)


def parse_comments(text: str) -> dict[str, str]:
    """`#Age: 74` / `# Sex: Male` lines -> {"age": "74", "sex": "Male"}; lines without a colon are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        body = line.strip()
        if not body.startswith("#"):
            continue
        key, sep, value = body.lstrip("#").partition(":")
        if sep and key.strip():
            out.setdefault(key.strip().lower(), value.strip())
    return out


def read_header(root: Path, rel: str) -> HeaderInfo | HeaderProblem:
    """Parse `root/rel.hea`; a header that cannot be read or parsed is a HeaderProblem (`unreadable`)."""
    hea = root / f"{rel}.hea"
    try:
        text = hea.read_text()
        n_sig, fs, sig_len, sigs = parse_header(text)
    except (OSError, ValueError, IndexError, UnicodeDecodeError) as err:
        return HeaderProblem(rel, "unreadable", f"header {hea.name} cannot be parsed ({type(err).__name__}: {err})"
                             "; re-download or rewrite the header")
    if "/" in text.split()[0]:  # a multi-segment record's first field is name/segments
        return HeaderProblem(rel, "unreadable", f"header {hea.name} is a multi-segment record; merge its segments "
                             "into one record")
    if not fs > 0:
        return HeaderProblem(rel, "unreadable", f"header {hea.name} gives sampling rate {fs}; fix the header")
    leads = tuple(" ".join(s[8:]) if len(s) > 8 else "" for s in sigs)
    if len(sigs) != n_sig:
        return HeaderProblem(rel, "unreadable", f"header {hea.name} announces {n_sig} signals but describes "
                             f"{len(sigs)}; fix the header")
    return HeaderInfo(path=rel, name=Path(rel).name, fs=float(fs), n_samples=sig_len, leads=leads,
                      comments=parse_comments(text))


def dx_codes(comments: dict[str, str]) -> list[str]:
    """The `#Dx` codes of a header (comma- or space-separated), as written."""
    return [c for c in comments.get("dx", "").replace(",", " ").split() if c]


def dx_superclasses(codes: list[str]) -> str:
    """PTB-XL diagnostic superclasses of Dx codes, sorted and joined by ';' (raybench.cohorts.diagnostics)."""
    found = {DX_SUPERCLASS[c] for c in codes if c in DX_SUPERCLASS}
    if not found and SINUS_RHYTHM in codes:
        found = {NORM}
    return ";".join(sorted(found))


def parse_age(text: str) -> float:
    """`#Age: 74` -> 74.0; `Unknown`, `NaN` or blank -> NaN."""
    try:
        value = float(text)
    except ValueError:
        return float("nan")
    return value if 0 <= value < 150 else float("nan")


def parse_sex(text: str) -> str:
    """`Male`/`M` -> "M", `Female`/`F` -> "F" (any case), else "" (the Challenge writes words; a number says
    nothing certain: PTB-XL's 0 is male, other collections differ)."""
    low = text.strip().lower()
    if low in ("male", "m", "man"):
        return "M"
    if low in ("female", "f", "woman"):
        return "F"
    return ""
