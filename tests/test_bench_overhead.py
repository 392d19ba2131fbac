"""bench overhead runs the policy it is given, with or without the per-token scores."""

from __future__ import annotations

import pytest

from thinkviz.bench.overhead import measure_overhead


@pytest.mark.parametrize("policy, scoring", [("h2o", True), ("knorm", False)])
def test_overhead_measures_the_engine_and_generate_on_the_same_tokens(tiny_llama, policy, scoring):
    result = measure_overhead(tiny_llama, new_tokens=8, budget=64, repeats=1, policy=policy, scoring=scoring)
    assert result.new_tokens == 8
    assert result.engine_tokens_per_second > 0 and result.generate_tokens_per_second > 0
    assert result.ratio == result.engine_tokens_per_second / result.generate_tokens_per_second
    assert result.engine_cpu_tokens_per_second > 0 and result.generate_cpu_tokens_per_second > 0
    assert result.cpu_ratio == result.engine_cpu_tokens_per_second / result.generate_cpu_tokens_per_second
