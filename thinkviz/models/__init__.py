"""Loading a model: the embedded GGUF or a Hugging Face model in 4 bits (:mod:`.loading`), the CPU
int4 backend (:mod:`.cpu_int4`), random weights in a real geometry (:mod:`.random_weights`) and the
one entry that turns a model name into a loaded model (:mod:`.sources`)."""
