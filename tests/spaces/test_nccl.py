"""NCCL legality (spaces/nccl.py): each variable alone, the per-collective lists of NCCL >= 2.24, and the
combinations that fail together, with and without an engine that turns NVLS off."""

from __future__ import annotations

import pytest

from spaces.nccl import (
    NCCL_NEWEST,
    UNSET,
    allows,
    check_nccl,
    check_nccl_combinations,
    forced,
    nccl_values,
    nccl_warnings,
    parse_nccl_version,
    version_text,
)


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("NCCL_PROTO", "LL,LL128", True), ("NCCL_PROTO", "^LL128", True), ("NCCL_PROTO", "simple", True),
        ("NCCL_ALGO", "Ring", True), ("NCCL_ALGO", "allreduce:nvls", True),
        ("NCCL_ALGO", "allreduce:tree;broadcast:ring", True), ("NCCL_ALGO", "ring,tree", True),
        ("NCCL_ALGO", "^tree", True), ("NCCL_ALGO", "allreduce:^tree", True),
        ("NCCL_ALGO", "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", True),
        ("NCCL_ALGO", "allreduce:nvlstree", False), ("NCCL_ALGO", "collnet", False),
        ("NCCL_ALGO", "allscatter:ring", False), ("NCCL_PROTO", "allreduce:simple", True),
        ("NCCL_ALGO", "Rings", False), ("NCCL_P2P_LEVEL", "PHB", True), ("NCCL_P2P_LEVEL", "5", True),
        ("NCCL_P2P_LEVEL", "FAR", False), ("NCCL_NTHREADS", "256", True), ("NCCL_NTHREADS", "100", False),
        ("NCCL_MIN_NCHANNELS", "33", False), ("NCCL_P2P_DISABLE", "1", True), ("NCCL_P2P_DISABLE", "yes", False),
        ("NCCL_NVLS_ENABLE", "2", True),
    ],
)
def test_nccl_legal_values(name: str, value: str, ok: bool) -> None:
    if ok:
        check_nccl(name, value)
    else:
        with pytest.raises(ValueError):
            check_nccl(name, value)


def test_a_part_naming_the_collective_wins_over_the_bare_list() -> None:
    assert allows("ring;allreduce:tree", "tree", func="allreduce")
    assert not allows("ring;allreduce:tree", "tree")
    assert allows("^ll128", "simple") and not allows("^ll128", "ll128")
    assert allows("allreduce:tree", "ring")  # no bare part: every other collective is NCCL's choice
    assert forced("ring;allreduce:nvls", {"nvls"}) and not forced("^nvls", {"nvls"})


def test_values_a_variable_can_take() -> None:
    assert nccl_values("NCCL_ALGO", {"NCCL_ALGO": "Ring"}, {}) == ["Ring"]
    assert nccl_values("NCCL_ALGO", {}, {"NCCL_ALGO": [UNSET, "allreduce:tree"]}) == [None, "allreduce:tree"]
    assert nccl_values("NCCL_PROTO", {"NCCL_PROTO": "LL"}, {"NCCL_PROTO": [UNSET]}) == ["LL"]


def test_nvls_needs_nvls_enable_only_where_the_engine_turns_it_off() -> None:
    searched = {"NCCL_ALGO": ["ring;allreduce:nvls"]}
    with pytest.raises(ValueError, match="needs NCCL_NVLS_ENABLE=1"):
        check_nccl_combinations({}, searched, nvls_off=True)
    check_nccl_combinations({}, searched, nvls_off=False)
    check_nccl_combinations({"NCCL_NVLS_ENABLE": "1"}, searched, nvls_off=True)
    with pytest.raises(ValueError, match="runs only with the Simple protocol"):
        check_nccl_combinations({}, {**searched, "NCCL_PROTO": [UNSET, "LL"]}, nvls_off=False)


def test_ll128_forced_is_a_warning() -> None:
    assert nccl_warnings({}, {"NCCL_PROTO": [UNSET, "LL128"]})
    assert nccl_warnings({"NCCL_PROTO": "^LL128"}, {}) == []


@pytest.mark.parametrize(
    ("algo", "proto", "version", "ok"),
    [
        # Before 2.24 a collective a bare list left without an algorithm fell back to Ring; since, it fails.
        ("Tree", None, (2, 23, 4), True), ("Tree", None, (2, 24, 0), False), ("NVLS", None, (2, 27, 3), False),
        ("^ring", None, (2, 24, 0), False), ("allreduce:tree;allgather:tree", None, (2, 24, 0), False),
        ("tree;allreduce:ring", None, (2, 27, 3), False),
        # Since 2.31 NCCL_ALGO re-enables only the collectives it names; a bare NCCL_PROTO forces the others.
        ("allreduce:tree", "Simple", (2, 30, 7), True), ("allreduce:tree", "Simple", (2, 31, 2), False),
        ("allreduce:tree", None, (2, 31, 2), True), ("allreduce:tree", "allreduce:simple", (2, 31, 2), True),
        ("ring;allreduce:tree", "Simple", (2, 31, 2), True), ("ring", "LL", (2, 31, 2), True),
    ],
)
def test_rules_that_changed_with_nccl_follow_the_version(algo: str, proto: str | None,
                                                         version: tuple[int, int, int], ok: bool) -> None:
    searched = {"NCCL_ALGO": [algo], **({"NCCL_PROTO": [proto]} if proto else {})}
    if ok:
        check_nccl_combinations({}, searched, nvls_off=False, nccl=version, where="test")
        return
    with pytest.raises(ValueError) as info:
        check_nccl_combinations({}, searched, nvls_off=False, nccl=version, where="test")
    assert f"NCCL {version_text(version)} (test" in str(info.value) and "\n" not in str(info.value)


def test_the_newest_rules_are_assumed_and_a_version_parses_or_is_one_line() -> None:
    assert parse_nccl_version("2.27.3") == (2, 27, 3) and parse_nccl_version("2.31") == (2, 31, 0)
    for bad in ("2", "v2.27", "2.x.1", ""):
        with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
            parse_nccl_version(bad)
    with pytest.raises(ValueError, match=f"NCCL {version_text(NCCL_NEWEST)}"):
        check_nccl_combinations({}, {"NCCL_ALGO": ["allreduce:tree"], "NCCL_PROTO": ["LL"]}, nvls_off=False)


@pytest.mark.parametrize(("name", "value"), [("NCCL_ALGO", "allreduce:tree;ring"), ("NCCL_ALGO", "ring;tree"),
                                            ("NCCL_PROTO", "allgather:simple;^ll")])
def test_every_entry_after_the_first_needs_a_collective_prefix(name: str, value: str) -> None:
    # NCCL's parseList (src/graph/tuning.cc, 2.24+): "All entries except the first must have a prefix".
    with pytest.raises(ValueError, match="every entry after the first needs a collective prefix"):
        check_nccl(name, value)
    check_nccl("NCCL_ALGO", "ring;allreduce:tree")


def test_before_2_24_only_the_comma_form_parses() -> None:
    for value in ("ring;allreduce:tree", "allreduce:tree"):
        with pytest.raises(ValueError, match=r"per-collective form, which NCCL 2\.23\.4 does not parse"):
            check_nccl_combinations({}, {"NCCL_ALGO": [value]}, nvls_off=False, nccl=(2, 23, 4), where="test")
    check_nccl_combinations({}, {"NCCL_ALGO": ["tree,ring"]}, nvls_off=False, nccl=(2, 23, 4), where="test")
    check_nccl_combinations({}, {"NCCL_ALGO": ["ring;allreduce:tree"]}, nvls_off=False, nccl=(2, 24, 0), where="t")
    assert NCCL_NEWEST == (2, 32, 3)
