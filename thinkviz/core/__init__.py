"""The engine and its parts: a decode loop that evicts physically (:mod:`.engine`), the per-head KV
cache it evicts from (:mod:`.cache`), the attention that reads it (:mod:`.attention`), KV-cache
quantization formats (:mod:`.kvquant`), the events a run streams (:mod:`.events`) and the one-line
faults a failed run ends with (:mod:`.faults`).  Nothing here imports the UI, the CLI, sweeps or
benchmarks."""
