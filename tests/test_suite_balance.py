"""benchmarks/suite_balance.py: the replay of xdist's loadfile scheduler and the reading of a junit file."""

from __future__ import annotations

from pathlib import Path

from benchmarks.suite_balance import files_in_order, measured, replay


def test_one_long_file_last_keeps_one_worker_busy_while_the_other_idles() -> None:
    shorts = [(f"s{i}.py", [1.0, 1.0, 1.0]) for i in range(4)]
    long = ("long.py", [10.0])
    wall, idle = replay([*shorts, long])
    # Each worker takes a file, then a second one (its pending tests are down to 2 only after a test): s0+s1 on
    # one, s2+s3 on the other, both done at 6 s; the long file then runs alone from 6 to 16 s.
    assert (wall, idle) == (16.0, 10.0)
    wall, idle = replay([long, *shorts])
    # Long first: one worker runs it and one short file it had taken at the start (3 s); the other the other three.
    assert (wall, idle) == (13.0, 4.0)


def test_a_file_with_few_tests_makes_its_worker_take_another_at_once() -> None:
    wall, _ = replay([("a.py", [5.0]), ("b.py", [5.0]), ("c.py", [5.0])], workers=1)
    assert wall == 15.0
    wall, idle = replay([("a.py", [5.0, 1.0, 1.0]), ("b.py", [1.0]), ("c.py", [1.0])])
    # Worker 0 holds a.py (3 pending tests: no second file), worker 1 takes b.py, then c.py at once.
    assert (wall, idle) == (7.0, 5.0)


def test_junit_times_are_keyed_by_node_id(tmp_path: Path) -> None:
    junit = tmp_path / "run.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.search.test_a" name="test_one[x]" time="2.5"/>'
        '<testcase classname="tests.search.test_a.TestGroup" name="test_two" time="1.0"/>'
        '</testsuite></testsuites>')
    times = measured(junit)
    assert times == {"tests/search/test_a.py::test_one[x]": 2.5, "tests/search/test_a.py::TestGroup::test_two": 1.0}
    ids = ["tests/search/test_a.py::test_one[x]", "tests/search/test_a.py::TestGroup::test_two",
           "tests/b.py::test_unmeasured"]
    assert files_in_order(ids, times) == [("tests/search/test_a.py", [2.5, 1.0]), ("tests/b.py", [0.0])]
