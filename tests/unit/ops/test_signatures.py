"""Failure signatures: real engine logs (tests/unit/data/engine_logs) and lines in vLLM's own formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.ops.signatures import SIGNATURES, Severity, latest_start, scan

LOGS = Path(__file__).parent / "data" / "engine_logs"


def names(text: str) -> list[str]:
    return [f.signature.name for f in scan(text)]


@pytest.mark.parametrize(
    ("sample", "expected", "detail"),
    [
        ("unknown_flag.txt", "unknown_flag", "--bogus-flag"),
        ("port_in_use.txt", "port_in_use", "Address already in use"),
        ("missing_model_path.txt", "missing_model", "/tmp/no/such/model"),
        ("missing_model_hub.txt", "missing_model", "LocalEntryNotFoundError"),
        ("missing_model_folder.txt", "missing_model", "/tmp/bench-probe/emptydir"),
        ("kv_cache_insufficient.txt", "kv_cache_insufficient", "estimated maximum model length is 58112"),
        ("python_headers_missing.txt", "python_headers_missing", "Python.h"),
    ],
)
def test_real_failing_starts(sample: str, expected: str, detail: str) -> None:
    findings = scan((LOGS / sample).read_text(encoding="utf-8"))
    assert [f.signature.name for f in findings] == [expected]
    assert detail in findings[0].detail
    # the cause quotes what the log said where its sentence has room for it, and is the sentence as written otherwise
    if "{detail}" in findings[0].signature.cause:
        assert detail in findings[0].cause
    else:
        assert findings[0].cause == findings[0].signature.cause


def test_healthy_start_has_no_findings() -> None:
    # It holds vLLM's ulimit warning, which quotes "Too many open files": no failure.
    text = (LOGS / "healthy_start.txt").read_text(encoding="utf-8")
    assert "Too many open files" in text
    assert scan(text) == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # formats from vllm/v1/metrics/loggers.py (the periodic stats line)
        (
            "(APIServer pid=1) INFO 11-29 16:17:10 [loggers.py:335] Engine 000: Avg prompt throughput: 5.7 tokens/s, "
            "Avg generation throughput: 285.2 tokens/s, Running: 8 reqs, Waiting: 4 reqs, Preemptions: 3, "
            "CPU KV cache usage: 71.0%, Prefix cache hit rate: 0.0%",
            ["preemption"],
        ),
        (
            "Engine 000: Avg prompt throughput: 0.0 tokens/s, Running: 16 reqs, Waiting: 9 reqs, "
            "CPU KV cache usage: 97.5%",
            ["kv_cache_full"],
        ),
        # vllm/v1/worker/cpu_worker.py, vllm/v1/core/kv_cache_utils.py
        (
            "ValueError: Available memory on node 0 (0.5/23.5 GiB) on kv cache allocation is less than requested "
            "memory for kv (4.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory",
            ["kv_cache_insufficient"],
        ),
        ("ValueError: No available memory for the cache blocks. Try increasing ...", ["kv_cache_insufficient"]),
        # out of memory: torch's CPU allocator, Python, the kernel's OOM killer (signal 9)
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 4294967296 bytes.",
            ["out_of_memory"],
        ),
        ("(EngineCore pid=7) ERROR 11-29 [core.py:1] MemoryError", ["out_of_memory"]),
        (
            "(EngineCore pid=7) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly "
            "(exit code: -9), shutting down executor.",
            ["out_of_memory"],
        ),
        ("RuntimeError: Process EngineCore (PID: 12) died with exit code -9", ["out_of_memory"]),
        # time-outs: vllm/v1/engine/core_client.py, vllm/v1/executor/multiproc_executor.py
        (
            "TimeoutError: Timed out waiting for engine core processes to start. This is often caused by slow "
            "weight loading for large models. Waited 600s (configured by VLLM_ENGINE_READY_TIMEOUT_S).",
            ["request_timeout"],
        ),
        ("TimeoutError: RPC call to execute_model timed out.", ["request_timeout"]),
        (
            "api_server.py: error: argument --max-model-len: invalid human_readable_int_or_auto value: 'lots'",
            ["unknown_flag"],
        ),
        ("OSError: [Errno 24] Too many open files", []),
        ("Engine 000: Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 9.5%", []),
    ],
)
def test_signatures_in_vllm_formats(line: str, expected: list[str]) -> None:
    assert names(line) == expected


def test_generic_crash_only_without_a_specific_cause() -> None:
    crash = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    assert names(crash) == ["engine_crashed"]
    assert names(crash + "\nOSError: [Errno 98] Address already in use") == ["port_in_use"]


def test_errors_come_before_warnings_and_lines_are_counted() -> None:
    text = "KV cache usage: 99.0%\nKV cache usage: 98.0%\nOSError: [Errno 98] Address already in use\n"
    findings = scan(text)
    assert [f.signature.severity for f in findings] == [Severity.ERROR, Severity.WARNING]
    assert findings[1].count == 2
    assert findings[1].line == "KV cache usage: 99.0%"
    assert findings[1].cause.startswith("The KV cache was 99.0 % full")


def test_latest_start_is_the_part_after_the_last_supervisor_mark() -> None:
    text = (
        "\n===== 2025-01-01 10:00:00 starting: python -m vllm ... --bogus\nerror: unrecognized arguments: --bogus\n"
        "\n===== 2025-01-01 10:05:00 starting: python -m vllm ...\nINFO all good\n"
    )
    assert latest_start(text) == "===== 2025-01-01 10:05:00 starting: python -m vllm ...\nINFO all good\n"
    assert names(latest_start(text)) == []
    assert names(text) == ["unknown_flag"]
    assert latest_start("no marks at all") == "no marks at all"


def test_every_signature_says_what_to_do() -> None:
    assert len({s.name for s in SIGNATURES}) == len(SIGNATURES)
    for sig in SIGNATURES:
        assert sig.title and sig.cause and sig.fix and sig.patterns
