"""A wfdb cohort's headers: found at any depth, comments read, Dx codes to diagnostic superclasses."""

from __future__ import annotations

import os

from raybench.cohorts.wfdb_headers import (
    HeaderInfo,
    HeaderProblem,
    dx_codes,
    dx_superclasses,
    find_headers,
    parse_age,
    parse_comments,
    parse_sex,
    read_header,
)


def test_headers_are_found_at_any_depth_and_symlinks_are_not_followed(tmp_path):
    for rel in ("a/b/c/r1.hea", "r2.hea", "x/r3.hea", "x/r3.dat"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("r 12 500 5000\n")
    os.symlink(tmp_path / "r2.hea", tmp_path / "x" / "link.hea")
    assert find_headers(tmp_path) == ["a/b/c/r1", "r2", "x/r3"]


def test_challenge_comments_are_read_whatever_their_spacing():
    text = "A1 12 500 5000\n#Age: 74\n# Sex: Male\n#Dx: 59118001,164934002\n#note without colon\n#Site:  Shaoxing \n"
    assert parse_comments(text) == {"age": "74", "sex": "Male", "dx": "59118001,164934002", "site": "Shaoxing"}
    assert dx_codes({"dx": "59118001, 164934002 426783006"}) == ["59118001", "164934002", "426783006"]
    assert (parse_age("74"), parse_sex("Male"), parse_sex("female"), parse_sex("1")) == (74.0, "M", "F", "")
    assert all(parse_age(t) != parse_age(t) for t in ("Unknown", "NaN", "", "300"))  # NaN


def test_dx_codes_map_to_superclasses_and_sinus_rhythm_alone_is_norm():
    assert dx_superclasses(["426783006"]) == "NORM"
    assert dx_superclasses(["426783006", "164873001"]) == "HYP"  # sinus rhythm with LVH is not normal
    assert dx_superclasses(["59118001", "164934002", "164865005"]) == "CD;MI;STTC"
    assert dx_superclasses(["164889003"]) == "" and dx_superclasses([]) == ""  # AF: a rhythm, no superclass


def test_a_header_is_parsed_or_named_as_the_problem(tmp_path):
    (tmp_path / "ok.hea").write_text("ok 2 257 2570\nok.mat 16+24 1000/mV 16 0 0 0 0 aVR\nok.mat 16+24 1000/mV 16 0 "
                                     "0 0 0 V1\n#Dx: 426783006\n")
    info = read_header(tmp_path, "ok")
    assert isinstance(info, HeaderInfo) and (info.fs, info.n_samples, info.leads) == (257.0, 2570, ("aVR", "V1"))
    assert info.comments == {"dx": "426783006"}
    (tmp_path / "bad.hea").write_text("bad twelve\n")
    (tmp_path / "few.hea").write_text("few 12 500 5000\nfew.dat 16 1000 16 0 0 0 0 I\n")
    (tmp_path / "seg.hea").write_text("seg/2 12 500 10000\nseg_1 5000\nseg_2 5000\n")
    for name, words in (("bad", "cannot be parsed"), ("few", "announces 12 signals"), ("seg", "multi-segment")):
        problem = read_header(tmp_path, name)
        assert isinstance(problem, HeaderProblem) and problem.reason == "unreadable" and words in problem.detail
