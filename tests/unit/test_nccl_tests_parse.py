"""benchmarks/nccl_tests.py: all_reduce_perf's table and the comparison with the sweep,
on the output both printed in one call on an H200 (world size 1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from nccl_tests import (
    NcclTestsOutputError,
    compare,
    format_comparison,
    large_message,
    parse_nccl_tests,
    parse_nccl_tests_meta,
)

from cluster_kit.report.allreduce import parse_sweep_log

DATA = ROOT / "tests" / "data"
NCCL_LOG = (DATA / "nccl_tests" / "all_reduce_perf_h200_ws1.log").read_text()
SWEEP_LOG = (DATA / "allreduce" / "nccl_h200_ws1_beside_nccl_tests.log").read_text()


def test_every_size_of_the_real_table_is_read():
    rows = parse_nccl_tests(NCCL_LOG)
    sizes = [r["bytes"] for r in rows]
    assert sizes == [8 << i for i in range(30)]  # 8 B to 4 GiB, doubling
    assert all(r["dtype"] == "float" and r["redop"] == "sum" for r in rows)
    assert all(r["count"] * 4 == r["bytes"] for r in rows)
    for r in rows:
        for side in ("out_of_place", "in_place"):
            assert r[side]["wrong"] == 0
            assert r[side]["busbw_gbps"] == 0.0  # one rank: nothing crosses a link
            assert r[side]["time_us"] > 0


def test_algbw_is_bytes_over_time_as_printed():
    for r in parse_nccl_tests(NCCL_LOG):
        side = r["out_of_place"]
        expected = r["bytes"] / side["time_us"] / 1e3
        assert side["algbw_gbps"] == pytest.approx(expected, rel=0.02, abs=0.01)


def test_header_and_summary_lines():
    meta = parse_nccl_tests_meta(NCCL_LOG)
    assert meta["nccl_library"] == meta["nccl_headers"]  # built against the NCCL it ran
    assert meta["out_of_bounds"] == 0
    assert meta["avg_busbw_gbps"] == 0.0
    assert meta["version"]


def test_comparison_covers_every_size_and_falls_back_to_algbw_at_one_rank():
    rows = compare(parse_sweep_log(SWEEP_LOG), parse_nccl_tests(NCCL_LOG))
    assert len(rows) == 30
    assert all(r["busbw_ratio"] is None for r in rows)  # 0 / 0
    assert all(r["algbw_ratio"] and r["algbw_ratio"] > 0 for r in rows)
    large = large_message(rows)
    assert large["sizes"] == [256 << 20 << i for i in range(5)]
    assert large["metric"].startswith("algbw")
    assert large["ratio"] == pytest.approx(
        large["sweep_algbw_gbps"] / large["nccl_algbw_gbps"]
    )
    text = format_comparison(rows, large)
    assert text.splitlines()[1].split()[:2] == ["8", "B"]
    assert "large messages (max over sizes 256 MiB to 4 GiB)" in text


def test_busbw_ratio_is_used_where_links_carry_data():
    rows = [
        {
            "bytes": 1 << 30,
            "sweep_busbw_gbps": 360.0,
            "nccl_busbw_gbps": 400.0,
            "sweep_algbw_gbps": 240.0,
            "nccl_algbw_gbps": 266.7,
        },
        {
            "bytes": 2 << 30,
            "sweep_busbw_gbps": 380.0,
            "nccl_busbw_gbps": 390.0,
            "sweep_algbw_gbps": 253.3,
            "nccl_algbw_gbps": 260.0,
        },
        {
            "bytes": 1 << 20,
            "sweep_busbw_gbps": 900.0,
            "nccl_busbw_gbps": 1.0,
            "sweep_algbw_gbps": 1.0,
            "nccl_algbw_gbps": 1.0,
        },
    ]
    large = large_message(rows)
    assert large["metric"] == "busbw"
    assert large["ratio"] == pytest.approx(380.0 / 400.0)  # small sizes do not count


def test_sizes_only_one_side_measured_are_left_out():
    sweep = parse_sweep_log(SWEEP_LOG)
    nccl = [r for r in parse_nccl_tests(NCCL_LOG) if r["bytes"] <= 1 << 20]
    assert [r["bytes"] for r in compare(sweep, nccl)] == [8 << i for i in range(18)]
    assert large_message([])["ratio"] is None


def test_a_cut_result_line_names_its_line():
    lines = NCCL_LOG.splitlines()
    index = next(i for i, line in enumerate(lines) if line.strip().startswith("8 "))
    lines[index] = lines[index].rsplit(maxsplit=3)[0]
    with pytest.raises(NcclTestsOutputError, match=rf"^line {index + 1}: 10 fields"):
        parse_nccl_tests("\n".join(lines))


def test_unchecked_results_read_as_none():
    line = "  1048576  262144  float  sum  -1  12.50  83.89  0.00  N/A  10.00  104.86  0.00  N/A"
    (row,) = parse_nccl_tests(line)
    assert (
        row["out_of_place"]["wrong"] is None and row["in_place"]["algbw_gbps"] == 104.86
    )


def test_nccl_algbw_is_recomputed_where_the_table_keeps_one_digit():
    rows = {
        r["bytes"]: r
        for r in compare(parse_sweep_log(SWEEP_LOG), parse_nccl_tests(NCCL_LOG))
    }
    assert rows[1 << 20]["nccl_algbw_gbps"] == pytest.approx(1388.3, rel=0.01)
    big = rows[2 << 30]
    assert big["nccl_algbw_printed_gbps"] == 2e6  # printed "2e+06"
    assert big["nccl_algbw_gbps"] == pytest.approx((2 << 30) / 1.33 / 1e3)
    assert big["algbw_ratio"] == pytest.approx(1.33 / 16.26, rel=1e-3)
