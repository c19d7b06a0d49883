"""Reading Prometheus text exposition (an engine's /metrics) into plain numbers."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_totals(text: str) -> dict[str, float]:
    """Sum every sample by its name over all label sets (e.g. vllm:num_requests_running over engines)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals
