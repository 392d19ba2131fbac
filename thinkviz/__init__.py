"""ThinkViz: watch KV-cache eviction inside a reasoning language model."""
