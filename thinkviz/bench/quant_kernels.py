"""One linear layer, every way ThinkViz can run it on the CPU: the numbers behind the 4-bit backend choice.

For each weight shape of a model (its decoder linears and its output head) and each number
of activation rows (1 = a decode step, 32 = a replay chunk), the time of one call of:

- ``float32``: ``F.linear`` on the float weight (the unquantized model);
- ``bitsandbytes NF4``: ``bnb.nn.Linear4bit`` (its fused CPU kernel where the CPU has
  avx512_bf16, else dequantize-then-matmul); not for the head, which transformers keeps in
  float32 when it loads a model with bitsandbytes;
- ``torch-int4``: :class:`~thinkviz.models.cpu_int4.Int4Linear` (``Int8Linear`` for the head), casts
  included;
- ``int4 kernel, float32 input``: the same PyTorch kernel fed float32 activations, which
  shows why the backend casts to bfloat16.

Contenders alternate within each repeat and keep their best; weights are random (the speed
of these kernels does not depend on the values).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from collections.abc import Callable

import torch
from torch import nn

from ..models import cpu_int4

KERNELS = ("float32", "bitsandbytes NF4", "torch-int4", "int4 kernel, float32 input")


@dataclass
class KernelTimes:
    out_features: int
    in_features: int
    rows: int
    microseconds: dict[str, float]  # kernel -> best time of one call; missing where it cannot run


def model_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """Distinct ``(N, K)`` of the decoder linears, then the output head."""
    shapes: list[tuple[int, int]] = []
    for module in model.model.layers[0].modules():
        if isinstance(module, nn.Linear) and tuple(module.weight.shape) not in shapes:
            shapes.append(tuple(module.weight.shape))
    shapes.append(tuple(model.get_output_embeddings().weight.shape))
    return shapes


def _best(call: Callable[[], object], repeats: int, number: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            call()
        best = min(best, (time.perf_counter() - start) / number)
    return best * 1e6


def _contenders(linear: nn.Linear, head: bool) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    import bitsandbytes as bnb  # here, not at the top: see tests/test_imports.py (DEFERRED)

    calls: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"float32": linear}
    if not head:
        nf4 = bnb.nn.Linear4bit(
            linear.in_features, linear.out_features, bias=False, compute_dtype=torch.float32, quant_type="nf4"
        )
        nf4.weight = bnb.nn.Params4bit(linear.weight.detach().clone(), requires_grad=False, quant_type="nf4")
        calls["bitsandbytes NF4"] = nf4.to("cpu").eval()
    if cpu_int4.available() is None and cpu_int4.fits(linear):
        packed = cpu_int4.Int8Linear(linear) if head else cpu_int4.Int4Linear(linear)
        calls["torch-int4"] = packed
        if not head:
            calls["int4 kernel, float32 input"] = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, packed.packed, cpu_int4.GROUP, packed.scale_zero.float()
            )
    return calls


@torch.inference_mode()
def measure_kernels(
    shapes: list[tuple[int, int]], rows: tuple[int, ...] = (1, 32), repeats: int = 5, budget_seconds: float = 0.05
) -> list[KernelTimes]:
    """Time every contender on every shape (the last shape is taken as the output head)."""
    results = []
    generator = torch.Generator().manual_seed(0)
    for index, (n, k) in enumerate(shapes):
        linear = nn.Linear(k, n, bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(n, k, generator=generator) * 0.05)
        calls = _contenders(linear, head=index == len(shapes) - 1)
        for m in rows:
            x = torch.randn(m, k, generator=generator)
            for call in calls.values():
                call(x)  # warm-up; bitsandbytes repacks its weight on the first CPU call
            bound = {name: functools.partial(call, x) for name, call in calls.items()}
            once = {name: max(1e-6, _best(call, 1, 1) / 1e6) for name, call in bound.items()}
            times = {name: float("inf") for name in calls}
            for _ in range(repeats):
                for name, call in bound.items():
                    number = max(1, int(budget_seconds / once[name]))
                    times[name] = min(times[name], _best(call, 1, number))
            results.append(KernelTimes(n, k, m, times))
    return results
