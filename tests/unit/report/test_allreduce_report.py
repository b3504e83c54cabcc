"""The all-reduce report on real sweep output captured from gloo runs on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_kit.report.allreduce import (
    SweepLogError,
    format_size,
    parse_sweep_log,
    parse_sweep_meta,
    summarise,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "allreduce"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_parse_picks_every_size_out_of_a_torchrun_log() -> None:
    rows = parse_sweep_log(read("gloo_4proc_cpu.log"))
    assert [r["bytes"] for r in rows] == [8 << i for i in range(20)]
    assert {r["world_size"] for r in rows} == {4}
    assert {r["backend"] for r in rows} == {"gloo"}
    assert all(r["check"] == "ok" for r in rows)


def test_busbw_is_algbw_times_2_n_minus_1_over_n() -> None:
    for r in parse_sweep_log(read("gloo_4proc_cpu.log")):
        assert r["busbw_gbps"] == pytest.approx(
            r["algbw_gbps"] * 1.5, rel=1e-3, abs=2e-6
        )
        assert r["algbw_gbps"] == pytest.approx(
            r["bytes"] / r["time_us"] / 1e3, rel=1e-3, abs=2e-6
        )


def test_meta_line_names_the_run() -> None:
    meta = parse_sweep_meta(read("gloo_4proc_cpu.log"))
    assert meta["backend"] == "gloo" and meta["world_size"] == 4
    assert meta["torch"].startswith("2.")


def test_marker_is_found_behind_an_srun_label() -> None:
    line = read("gloo_4proc_cpu.log").splitlines()
    labelled = "\n".join("0: " + x for x in line)
    assert len(parse_sweep_log(labelled)) == 20


def test_error_marker_lines_are_not_rows() -> None:
    rows = parse_sweep_log(read("gloo_2proc_mismatch.log"))
    assert len(rows) == 1 and rows[0]["check"] == "mismatch"


def test_a_broken_marker_line_is_an_error_with_its_line_number() -> None:
    with pytest.raises(SweepLogError, match="line 2"):
        parse_sweep_log('hello\nCLUSTERKIT_ALLREDUCE {"kind": "res')


def test_small_sweep_uses_its_largest_size_and_says_so() -> None:
    rows = parse_sweep_log(read("gloo_4proc_cpu.log"))
    text, doc, passed = summarise(rows, expect_busbw_gbps=None)
    largest = rows[-1]
    assert passed is True
    assert doc["large_message_busbw_gbps"] == largest["busbw_gbps"]
    assert "largest size measured (4 MiB)" in doc["basis"]
    assert "4 MiB" in text and "PASS" in text
    json.dumps(doc)  # the document is plain JSON


def test_large_message_figure_is_the_max_over_256_mib_and_up() -> None:
    rows = [
        {
            "bytes": 128 << 20,
            "time_us": 1.0,
            "algbw_gbps": 900.0,
            "busbw_gbps": 990.0,
            "check": "ok",
            "world_size": 8,
            "backend": "nccl",
        },
        {
            "bytes": 256 << 20,
            "time_us": 1.0,
            "algbw_gbps": 200.0,
            "busbw_gbps": 350.0,
            "check": "ok",
            "world_size": 8,
            "backend": "nccl",
        },
        {
            "bytes": 512 << 20,
            "time_us": 1.0,
            "algbw_gbps": 210.0,
            "busbw_gbps": 367.5,
            "check": "ok",
            "world_size": 8,
            "backend": "nccl",
        },
    ]
    _, doc, passed = summarise(rows, expect_busbw_gbps=360)
    assert doc["large_message_busbw_gbps"] == 367.5 and passed is True
    _, doc, passed = summarise(rows, expect_busbw_gbps=400)
    assert passed is False
    assert any("below the expected 400" in n for n in doc["notes"])


def test_below_expectation_fails() -> None:
    rows = parse_sweep_log(read("gloo_4proc_cpu.log"))
    text, doc, passed = summarise(rows, expect_busbw_gbps=400)
    assert passed is False and "FAIL" in text
    assert doc["expect_busbw_gbps"] == 400


def test_wrong_result_fails_even_without_expectation() -> None:
    rows = parse_sweep_log(read("gloo_2proc_mismatch.log"))
    text, doc, passed = summarise(rows, expect_busbw_gbps=None)
    assert passed is False and doc["checks_ok"] is False
    assert "wrong all-reduce result at 8 B" in text


def test_no_rows_fails() -> None:
    _, doc, passed = summarise(parse_sweep_log("srun: error: node down\n"), 100)
    assert passed is False and doc["rows"] == []


def test_world_size_one_is_reported_honestly() -> None:
    row = {
        "bytes": 1 << 30,
        "time_us": 5.0,
        "algbw_gbps": 2e5,
        "busbw_gbps": 0.0,
        "check": "ok",
        "world_size": 1,
        "backend": "nccl",
    }
    _, doc, passed = summarise([row], expect_busbw_gbps=100)
    assert passed is False
    assert any("world size 1" in n for n in doc["notes"])


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(8, "8 B"), (1024, "1 KiB"), (64 << 20, "64 MiB"), (4 << 30, "4 GiB")],
)
def test_format_size(nbytes: int, text: str) -> None:
    assert format_size(nbytes) == text


def test_h200_one_rank_nccl_sweep_is_parsed_and_judged_honestly() -> None:
    text = read("nccl_h200_ws1.log")  # captured on the lent H200, 8 B to 4 GiB
    rows = parse_sweep_log(text)
    assert [r["bytes"] for r in rows] == [8 << i for i in range(30)]
    assert all(r["busbw_gbps"] == 0.0 and r["check"] == "ok" for r in rows)
    assert parse_sweep_meta(text)["device_name"] == "NVIDIA H200"
    _, doc, passed = summarise(rows, expect_busbw_gbps=None)
    assert passed is True and doc["basis"] == "max busbw over sizes >= 256 MiB"
    _, doc, passed = summarise(rows, expect_busbw_gbps=100)
    assert passed is False and doc["large_message_busbw_gbps"] == 0.0
