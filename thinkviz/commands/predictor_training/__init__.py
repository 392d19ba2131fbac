"""Training and evaluation of the DynTS importance predictor (``python -m thinkviz train-predictor``):
the prompt set, the corpus the model generates from it, the labels, the fit and the measures.
The predictor itself and its file format are :mod:`thinkviz.predictor`."""
